// Package planeval reproduces the chain-quality evaluation of the MOSTO paper
// (Sec. V, Fig. 2 and "number of proxies"): on a set of full-mesh graphs it
// compares, for every ordered pair of locations and several slow-start round
// counts, the cost of the planner's chain (pathcomp.Fronts.Best) with the
// cost of the shortest-path and the minimax chain, and writes the CDFs of the
// relative improvement as an SVG figure and the summary as a markdown table.
// It does no I/O of its own beyond the writers it is given.
package planeval
