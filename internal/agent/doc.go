// Package agent is the proxy-side client of the mosto controller. It joins
// the overlay with a join token (a key and CSR made locally, the controller
// pinned by the CA hash in the token), registers the FEP, runs the
// measurement endpoint and the prober and reports RTT changes, and
// long-polls the chain table of its LoP, swapping an immutable snapshot
// (chain index, members, overlay keyring) atomically and persisting it so a
// proxy restarted while the controller is down still routes.
//
// It owns the files of a proxy data directory: fep.key, fep.crt, ca.crt and
// table.json. It does not relay traffic: the proxy daemon reads the
// snapshot through Lookup, Members and Keys (or the OnUpdate hook).
package agent
