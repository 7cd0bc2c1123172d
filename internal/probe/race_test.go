//go:build race

package probe

// raceEnabled loosens timing tolerances: the race detector slows the
// in-process emulator's delay line as well as the probes.
const raceEnabled = true
