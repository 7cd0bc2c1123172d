// Package mget is the receiver-driven multi-source, multi-path download of
// `mosto get` (seed 003, mmFTP). One object, several sources (mirror URLs,
// each over one or more paths); each (source, path) is a sub-flow: one
// keep-alive HTTP/1.1 connection carrying pipelined Range requests, as many
// bytes in flight as its window allows (twice its measured rate x RTT plus a
// range). Sched hands out ranges: always the next idle one in ascending
// order, so faster sub-flows request more; a sub-flow that stalls (no byte
// for Config.Stall) or fails gives its ranges back to the pool at once
// (keeping what it received) and retries with backoff; when no range is
// idle, the end game duplicates the unfinished ranges on faster sub-flows.
//
// The first source that answers (in the given order) defines the object:
// length and validators (strong ETag, else Last-Modified); a mirror that
// disagrees, answers 200 to a range request, or sends a wrong
// Content-Range is dropped; a truncated response is retried. Bytes are
// written in place; a resume file (OUT.mget) records which bytes of which
// version are on disk, so Config.Continue resumes after a killed client.
// With Config.SHA256 the file's hash is checked at the end (a mismatch is
// an error and leaves no resume file).
//
// The package owns the goroutines of one Get call (one per sub-flow, all
// stopped before Get returns) and the output and resume files; it knows
// nothing of chains or the controller: a path is a Dial function.
package mget
