//go:build !linux

package xagent

import (
	"errors"
	"time"
)

var start = time.Now()

func monoNow() time.Duration { return time.Since(start) }

func bootID() ([16]byte, error) { return [16]byte{}, errors.New("xagent: not supported on this OS") }
