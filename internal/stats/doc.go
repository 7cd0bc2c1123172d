// Package stats holds the descriptive statistics and the non-parametric
// comparisons the benchmarks report: mean, standard deviation, percentiles,
// the Vargha-Delaney A12 effect size and the Mann-Whitney U test with a
// two-sided p-value (exact for small samples without ties, otherwise the
// normal approximation with tie and continuity corrections), as used in the
// TTS paper (seed 002). It is pure: no I/O, no goroutines, no clocks.
package stats
