// Package etcdhttp is a small etcd v3 client over etcd's JSON/HTTP gateway
// (grpc-gateway, served by etcd on its client URLs): key-value ranges, puts,
// deletes, transactions and compaction, leases, streaming watches, and a
// leader election with the semantics of etcd's concurrency.Election. It uses
// only net/http and encoding/json, so a binary that links it does not link
// gRPC, protobuf or etcd's client/v3.
//
// Wire format: field names are the proto names (snake_case), bytes are
// standard base64, 64-bit integers are JSON strings, enums are their names.
// Requests go to one endpoint at a time; a request that could not be sent
// (the endpoint refused or timed out the connection) is retried on the next
// endpoint, and reads are retried on the next endpoint after any transport
// error. Errors that etcd returns keep its gRPC code and message (*Error).
package etcdhttp
