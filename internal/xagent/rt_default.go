//go:build !linux

package xagent

import (
	"errors"
	"net"
	"os"
)

func realtimeFile(c net.Conn, prio int) (*os.File, func(), error) {
	return nil, nil, errors.New("xagent: real-time threads not supported on this OS")
}
