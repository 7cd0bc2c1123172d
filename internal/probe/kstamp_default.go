//go:build !linux

package probe

import "net"

var oobSize = 0

func enableRxTimestamps(c *net.UDPConn) bool { return false }

func rxTimestamp(oob []byte) int64 { return 0 }

func readQueued(c *net.UDPConn, buf, oob []byte) (n, oobn int, ok bool) { return 0, 0, false }
