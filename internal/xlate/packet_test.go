package xlate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// testPkt is a TCP segment as the tests craft and decode it.
type testPkt struct {
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    byte
	Win      uint16
	SACK     [][2]uint32
	TS       bool
	TSval    uint32
	TSecr    uint32
	Payload  []byte
}

const (
	tcpFIN = 0x01
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

func (p testPkt) options() []byte {
	var o []byte
	if p.TS {
		o = append(o, 1, 1, 8, 10)
		o = binary.BigEndian.AppendUint32(o, p.TSval)
		o = binary.BigEndian.AppendUint32(o, p.TSecr)
	}
	if len(p.SACK) > 0 {
		o = append(o, 1, 1, 5, byte(2+8*len(p.SACK)))
		for _, b := range p.SACK {
			o = binary.BigEndian.AppendUint32(o, b[0])
			o = binary.BigEndian.AppendUint32(o, b[1])
		}
	}
	for len(o)%4 != 0 {
		o = append(o, 0)
	}
	return o
}

// bytes encodes the segment in an Ethernet frame with valid checksums.
func (p testPkt) bytes() []byte {
	opts := p.options()
	tcp := make([]byte, 20+len(opts)+len(p.Payload))
	binary.BigEndian.PutUint16(tcp[0:], p.Src.Port())
	binary.BigEndian.PutUint16(tcp[2:], p.Dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], p.Seq)
	binary.BigEndian.PutUint32(tcp[8:], p.Ack)
	tcp[12] = byte((20 + len(opts)) / 4 << 4)
	tcp[13] = p.Flags
	binary.BigEndian.PutUint16(tcp[14:], p.Win)
	copy(tcp[20:], opts)
	copy(tcp[20+len(opts):], p.Payload)
	binary.BigEndian.PutUint16(tcp[16:], tcpChecksum(p.Src.Addr(), p.Dst.Addr(), tcp))

	eth := make([]byte, 14)
	copy(eth[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(eth[6:12], []byte{2, 0, 0, 0, 0, 1})
	if p.Src.Addr().Is4() {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		ip[6] = 0x40 // DF
		ip[8] = 64
		ip[9] = 6
		s, d := p.Src.Addr().As4(), p.Dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], ^sum16(0, ip))
		return append(append(eth, ip...), tcp...)
	}
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
	ip[6] = 6
	ip[7] = 64
	s, d := p.Src.Addr().As16(), p.Dst.Addr().As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(append(eth, ip...), tcp...)
}

func sum16(acc uint32, b []byte) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

func tcpChecksum(src, dst netip.Addr, tcp []byte) uint16 {
	var ph []byte
	ph = append(ph, src.AsSlice()...)
	ph = append(ph, dst.AsSlice()...)
	if src.Is4() {
		ph = append(ph, 0, 6)
		ph = binary.BigEndian.AppendUint16(ph, uint16(len(tcp)))
	} else {
		ph = binary.BigEndian.AppendUint32(ph, uint32(len(tcp)))
		ph = append(ph, 0, 0, 0, 6)
	}
	c := make([]byte, len(tcp))
	copy(c, tcp)
	c[16], c[17] = 0, 0
	return ^sum16(uint32(sum16(0, ph)), c)
}

// decodePkt parses an Ethernet frame and checks every checksum.
func decodePkt(b []byte) (testPkt, error) {
	var p testPkt
	if len(b) < 14 {
		return p, errors.New("short frame")
	}
	var tcp []byte
	var src, dst netip.Addr
	switch binary.BigEndian.Uint16(b[12:]) {
	case 0x0800:
		ip := b[14:]
		if len(ip) < 20 || ip[0] != 0x45 {
			return p, errors.New("bad IPv4 header")
		}
		if sum16(0, ip[:20]) != 0xffff {
			return p, fmt.Errorf("IPv4 header checksum wrong (%#04x)", binary.BigEndian.Uint16(ip[10:]))
		}
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if tot > len(ip) {
			return p, errors.New("IPv4 total length past the frame")
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		tcp = ip[20:tot]
	case 0x86dd:
		ip := b[14:]
		if len(ip) < 40 {
			return p, errors.New("bad IPv6 header")
		}
		pl := int(binary.BigEndian.Uint16(ip[4:]))
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		tcp = ip[40 : 40+pl]
	default:
		return p, errors.New("not IP")
	}
	if len(tcp) < 20 {
		return p, errors.New("short TCP header")
	}
	if got, want := binary.BigEndian.Uint16(tcp[16:]), tcpChecksum(src, dst, tcp); got != want {
		return p, fmt.Errorf("TCP checksum %#04x, want %#04x", got, want)
	}
	p.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:]))
	p.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:]))
	p.Seq = binary.BigEndian.Uint32(tcp[4:])
	p.Ack = binary.BigEndian.Uint32(tcp[8:])
	p.Flags = tcp[13]
	p.Win = binary.BigEndian.Uint16(tcp[14:])
	doff := int(tcp[12]>>4) * 4
	if doff < 20 || doff > len(tcp) {
		return p, errors.New("bad data offset")
	}
	o := tcp[20:doff]
	for len(o) > 0 {
		if o[0] == 0 {
			break
		}
		if o[0] == 1 {
			o = o[1:]
			continue
		}
		if len(o) < 2 || int(o[1]) < 2 || int(o[1]) > len(o) {
			return p, errors.New("bad option")
		}
		l := int(o[1])
		switch o[0] {
		case 8:
			p.TS = true
			p.TSval = binary.BigEndian.Uint32(o[2:])
			p.TSecr = binary.BigEndian.Uint32(o[6:])
		case 5:
			for i := 2; i+8 <= l; i += 8 {
				p.SACK = append(p.SACK, [2]uint32{binary.BigEndian.Uint32(o[i:]), binary.BigEndian.Uint32(o[i+4:])})
			}
		}
		o = o[l:]
	}
	p.Payload = tcp[doff:]
	return p, nil
}
