package emu

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// virtio_net_hdr fields (little endian on the hosts this runs on).
const (
	vnetFlagNeedsCsum = 1
	gsoNone           = 0
	gsoTCPv4          = 1
	gsoTCPv6          = 4
	gsoECN            = 0x80
)

const (
	tcpFlagFIN = 0x01
	tcpFlagPSH = 0x08
	tcpFlagCWR = 0x80
)

var errNotGSO = errors.New("not a TCP GSO packet")

// isGSO reports whether buf (virtio header + IP packet) is a GSO super-packet.
func isGSO(buf []byte) bool {
	return len(buf) >= vnetHdrLen && buf[1]&^gsoECN != gsoNone
}

// splitGSO cuts a TCP GSO super-packet (virtio header + IP packet) into
// pieces of at most segs segments (segs*gso_size payload bytes), each with
// its own virtio header asking the receiving kernel to complete the TCP
// checksum; pieces of more than one segment stay GSO packets. Each piece is
// built in a buffer from alloc(n) and passed to emit.
func splitGSO(buf []byte, segs int, alloc func(n int) []byte, emit func(seg []byte)) error {
	segs = max(segs, 1)
	if len(buf) < vnetHdrLen+20 {
		return errNotGSO
	}
	gsoType := buf[1] &^ gsoECN
	gsoSize := int(binary.LittleEndian.Uint16(buf[4:6]))
	if (gsoType != gsoTCPv4 && gsoType != gsoTCPv6) || gsoSize == 0 {
		return fmt.Errorf("%w: type %d size %d", errNotGSO, gsoType, gsoSize)
	}
	pkt := buf[vnetHdrLen:]
	var ipHL int
	switch pkt[0] >> 4 {
	case 4:
		ipHL = int(pkt[0]&0x0f) * 4
		if ipHL < 20 || pkt[9] != 6 {
			return fmt.Errorf("%w: bad IPv4 header", errNotGSO)
		}
	case 6:
		ipHL = 40
		if pkt[6] != 6 {
			return fmt.Errorf("%w: IPv6 next header %d", errNotGSO, pkt[6])
		}
	default:
		return fmt.Errorf("%w: IP version %d", errNotGSO, pkt[0]>>4)
	}
	if len(pkt) < ipHL+20 {
		return fmt.Errorf("%w: short packet", errNotGSO)
	}
	tcpHL := int(pkt[ipHL+12]>>4) * 4
	hl := ipHL + tcpHL
	if tcpHL < 20 || len(pkt) < hl {
		return fmt.Errorf("%w: bad TCP header", errNotGSO)
	}
	payload := pkt[hl:]
	seq0 := binary.BigEndian.Uint32(pkt[ipHL+4:])
	flags0 := pkt[ipHL+13]
	var id0 uint16
	if ipHL != 40 {
		id0 = binary.BigEndian.Uint16(pkt[4:6])
	}
	for i, off := 0, 0; off < len(payload) || (off == 0 && len(payload) == 0); i++ {
		n := min(segs*gsoSize, len(payload)-off)
		seg := alloc(vnetHdrLen + hl + n)
		seg = seg[:vnetHdrLen+hl+n]
		// virtio header: checksum partial; GSO only if still needed.
		clear(seg[:vnetHdrLen])
		seg[0] = vnetFlagNeedsCsum
		if n > gsoSize {
			seg[1] = buf[1]
			binary.LittleEndian.PutUint16(seg[2:], uint16(hl))
			binary.LittleEndian.PutUint16(seg[4:], uint16(gsoSize))
		}
		binary.LittleEndian.PutUint16(seg[6:], uint16(ipHL))
		binary.LittleEndian.PutUint16(seg[8:], 16)
		ip := seg[vnetHdrLen:]
		copy(ip, pkt[:hl])
		copy(ip[hl:], payload[off:off+n])
		tcp := ip[ipHL:]
		binary.BigEndian.PutUint32(tcp[4:], seq0+uint32(off))
		last := off+n >= len(payload)
		f := flags0
		if !last {
			f &^= tcpFlagFIN | tcpFlagPSH
		}
		if i > 0 {
			f &^= tcpFlagCWR
		}
		tcp[13] = f
		tcpLen := tcpHL + n
		var sum uint32
		if ipHL == 40 {
			binary.BigEndian.PutUint16(ip[4:], uint16(tcpLen))
			sum = sumBytes(0, ip[8:40]) + uint32(tcpLen) + 6
		} else {
			binary.BigEndian.PutUint16(ip[2:], uint16(ipHL+tcpLen))
			binary.BigEndian.PutUint16(ip[4:], id0+uint16(off/gsoSize))
			ip[10], ip[11] = 0, 0
			binary.BigEndian.PutUint16(ip[10:], ^fold(sumBytes(0, ip[:ipHL])))
			sum = sumBytes(0, ip[12:20]) + uint32(tcpLen) + 6
		}
		binary.BigEndian.PutUint16(tcp[16:], fold(sum))
		emit(seg)
		off += n
		if n == 0 {
			break
		}
	}
	return nil
}

// sumBytes adds b as big-endian 16-bit words to sum (one's complement, unfolded).
func sumBytes(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
