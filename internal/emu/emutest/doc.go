// Package emutest brings emulated worlds (internal/emu) up for tests and
// removes them when the test ends. It lives apart from emu so that the
// mosto binary does not link the testing package.
package emutest
