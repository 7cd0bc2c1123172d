// Package cli implements the mosto command line: one file per subcommand
// (plan, emu, proxy, controller, demo, bench). It parses flags, wires
// packages together and prints results; the behaviour lives in the packages
// it calls. It owns no state beyond one invocation.
package cli
