// Package etcdstore keeps the controller's state in etcd so that several
// controllers can share it: one of them, elected through an etcd lease-bound
// key (etcdhttp.Election, the semantics of etcd's concurrency.Election),
// computes tables; all of them serve the API and learn about changes through
// etcd watches. It talks to etcd through etcd's JSON gateway
// (internal/etcdhttp), so the mosto binary links neither gRPC nor etcd's
// client/v3.
//
// Key layout under the prefix (default "/mosto/"):
//
//	fep/<id>          FEP JSON
//	rtt/<from>/<to>   RTT JSON (newest sample of the pair); <to> is @<dest> for a destination
//	dest/<id>         destination registered through the API, JSON
//	version           written by NextVersion; the etcd revision of that write is the version
//	tv/<lop>          table version of a LoP, 20 decimal digits (compared as strings)
//	table/<lop>       8-byte big-endian version + table data
//	keys              HMAC keys JSON
//	token/<id>        join token JSON
//	election/<lease>  leader election (lease id in hex, value the controller id)
package etcdstore
