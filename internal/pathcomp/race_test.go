//go:build race

package pathcomp

const raceEnabled = true
