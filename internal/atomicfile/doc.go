// Package atomicfile replaces a file's content crash-safely: a temporary file
// in the same directory, fsync, rename, fsync of the directory. The agent's
// persisted tables and certificates and the PKI's files use it.
package atomicfile
