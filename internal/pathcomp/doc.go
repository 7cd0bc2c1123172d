// Package pathcomp is the chain planner of the mosto controller: the
// transfer-time model (rounds of slow start, cost of a proxy chain), the
// Pareto-front precomputation of Appendix A of the MOSTO paper (with its
// A_h/B_h pruning, plus the plain version, and a hop-bounded variant that
// limits the proxies of every chain), the per-size lookup, baselines
// (shortest path, minimax, brute force) and the JSON table format that lookup
// proxies load. It is pure: no I/O, no goroutines, no clocks.
package pathcomp
