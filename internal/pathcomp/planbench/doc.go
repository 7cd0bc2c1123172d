// Package planbench measures the chain planner: precomputation time (wall
// clock and thread CPU time) and memory against the number of locations,
// pruned against plain dynamic program, on the embedded Rocketfuel maps,
// random subsets of the WonderProxy matrix and larger synthetic matrices,
// plus the cost of a lookup. It backs `mosto plan bench`; unlike pathcomp it
// reads clocks and memory statistics.
package planbench
