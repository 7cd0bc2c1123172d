// Package report renders benchmark results: markdown tables and a
// hand-written SVG line plot (time against size per mode, optionally log-scale
// x, with p5-p95 whiskers). It depends on nothing but the standard library and
// does no I/O beyond the io.Writer it is given.
package report
