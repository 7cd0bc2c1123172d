// Package httpconnect parses HTTP/1.x CONNECT requests
// ("CONNECT host:port HTTP/1.1") with bounded header sizes, decodes an
// optional Proxy-Authorization Basic credential, and writes the replies a
// tunnelling proxy sends (200, 400, 403, 405, 407, 502, 504). Dialing and
// relaying belong to the caller (internal/relay).
package httpconnect
