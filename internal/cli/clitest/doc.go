// Package clitest lets a test binary act as the mosto binary, so that tests
// of other packages run real `mosto proxy` and `mosto controller` processes
// (in emulated worlds' namespaces) without building the binary: TestMain
// calls Main, and the test starts the command Mosto returns. Package cli's
// own tests cannot import it (it imports cli) and keep their TestMain.
package clitest
