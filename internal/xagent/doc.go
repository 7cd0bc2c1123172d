// Package xagent is the surrogate-side placement of the request router's
// handoff (docs/router.md, Placement): an Agent runs on a surrogate's host
// with internal/xlate's egress program and installs, on request, the entry
// that turns the surrogate's answer on a pooled connection into the
// router's packets to the client, so the response goes surrogate -> client
// without crossing the router; a Placer runs in the router and ships those
// entries to the agents.
//
// Control channel: one TCP connection per agent, kept open by the Placer.
// Both ends prove knowledge of a shared key (HMAC-SHA256 over two random
// nonces), then every frame carries a sequence number and a 16-byte
// HMAC-SHA256 tag under a key derived from the nonces (no replay across or
// within connections). The agent's hello says its boot id and
// CLOCK_MONOTONIC, from which the Placer moves the entry's timestamp offset
// onto the agent's clock (exact on the same kernel: namespaces; else within
// half the handshake's RTT, plus that as a margin, since a TSval ahead of
// the client's last one passes its PAWS check and one behind does not).
//
// Ordering: the router sends the entry before it writes the request on the
// pooled connection and does not wait for the agent's answer (no extra
// RTT). Its own entry for that direction stays, installed
// xlate.Entry.Remote: a surrogate packet that left before the agent's
// install (the agent lost the race to the surrogate's answer) reaches the
// router and is translated there, its TSval delta latched TSBack (the
// trip's estimate) lower, as the agent's egress latches it at send time,
// so the client sees one clock. A refusal, or a lost control connection,
// releases the router's entries (Release: the router's copy translates
// alone, the RR-side placement).
//
// It owns no packet path itself; internal/xlate does the translation.
package xagent
