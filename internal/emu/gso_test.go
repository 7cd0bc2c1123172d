package emu

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// gsoPacket builds a virtio header + IPv4/TCP GSO super-packet.
func gsoPacket(payload []byte, mss int, flags byte) []byte {
	b := make([]byte, vnetHdrLen+20+20+len(payload))
	b[0] = vnetFlagNeedsCsum
	b[1] = gsoTCPv4
	binary.LittleEndian.PutUint16(b[2:], 40)
	binary.LittleEndian.PutUint16(b[4:], uint16(mss))
	binary.LittleEndian.PutUint16(b[6:], 20)
	binary.LittleEndian.PutUint16(b[8:], 16)
	ip := b[vnetHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(40+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], 1000)
	ip[8], ip[9] = 64, 6
	copy(ip[12:], []byte{10, 77, 0, 1, 10, 77, 0, 2})
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], 5000)
	binary.BigEndian.PutUint16(tcp[2:], 80)
	binary.BigEndian.PutUint32(tcp[4:], 0xfffffff0) // wraps
	tcp[12] = 5 << 4
	tcp[13] = flags
	copy(tcp[20:], payload)
	return b
}

func TestSplitGSO(t *testing.T) {
	payload := make([]byte, 4000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	pkt := gsoPacket(payload, 1448, 0x18|tcpFlagFIN|tcpFlagCWR) // PSH|ACK|FIN|CWR
	var segs [][]byte
	err := splitGSO(pkt, 1, func(n int) []byte { return make([]byte, n) }, func(s []byte) { segs = append(segs, s) })
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) != 3 {
		t.Fatalf("got %d segments; want 3", len(segs))
	}
	var got []byte
	for i, s := range segs {
		if s[1] != gsoNone || s[0] != vnetFlagNeedsCsum {
			t.Errorf("seg %d: virtio header %x; want NEEDS_CSUM and no GSO", i, s[:vnetHdrLen])
		}
		ip := s[vnetHdrLen:]
		if tl := int(binary.BigEndian.Uint16(ip[2:])); tl != len(ip) {
			t.Errorf("seg %d: total length %d; want %d", i, tl, len(ip))
		}
		if fold(sumBytes(0, ip[:20])) != 0xffff {
			t.Errorf("seg %d: bad IPv4 header checksum", i)
		}
		if id := binary.BigEndian.Uint16(ip[4:]); id != 1000+uint16(i) {
			t.Errorf("seg %d: IP id %d; want %d", i, id, 1000+i)
		}
		tcp := ip[20:]
		if seq := binary.BigEndian.Uint32(tcp[4:]); seq != 0xfffffff0+uint32(1448*i) {
			t.Errorf("seg %d: seq %#x", i, seq)
		}
		last := i == len(segs)-1
		if f := tcp[13]; (f&tcpFlagFIN != 0) != last || (f&tcpFlagPSH != 0) != last || (f&tcpFlagCWR != 0) != (i == 0) {
			t.Errorf("seg %d: flags %#x", i, f)
		}
		// Complete the partial checksum as the kernel would and verify it.
		full := ^fold(sumBytes(0, tcp))
		c := make([]byte, len(tcp))
		copy(c, tcp)
		binary.BigEndian.PutUint16(c[16:], full)
		pseudo := sumBytes(0, ip[12:20]) + 6 + uint32(len(tcp))
		if fold(sumBytes(pseudo, c)) != 0xffff {
			t.Errorf("seg %d: TCP checksum does not verify", i)
		}
		got = append(got, tcp[20:]...)
	}
	if !bytes.Equal(got, payload) {
		t.Error("reassembled payload differs")
	}
}

func TestSplitGSORejects(t *testing.T) {
	pkt := gsoPacket(make([]byte, 100), 50, 0x10)
	pkt[1] = gsoNone
	if err := splitGSO(pkt, 1, func(n int) []byte { return make([]byte, n) }, func([]byte) {}); err == nil {
		t.Error("splitGSO of a non-GSO packet succeeded")
	}
	if err := splitGSO(pkt[:15], 1, func(n int) []byte { return make([]byte, n) }, func([]byte) {}); err == nil {
		t.Error("splitGSO of a truncated packet succeeded")
	}
}

func TestSplitGSOChunks(t *testing.T) {
	payload := make([]byte, 10*1000+500)
	for i := range payload {
		payload[i] = byte(i)
	}
	pkt := gsoPacket(payload, 1000, 0x18)
	var pieces [][]byte
	err := splitGSO(pkt, 4, func(n int) []byte { return make([]byte, n) }, func(s []byte) { pieces = append(pieces, s) })
	if err != nil {
		t.Fatal(err)
	}
	// 10.5 segments in pieces of 4: 4, 4, 2.5 -> three pieces, the last
	// two-and-a-half segments still GSO.
	if len(pieces) != 3 {
		t.Fatalf("got %d pieces; want 3", len(pieces))
	}
	var got []byte
	for i, p := range pieces {
		ip := p[vnetHdrLen:]
		if p[1] != gsoTCPv4 || binary.LittleEndian.Uint16(p[4:]) != 1000 {
			t.Errorf("piece %d: virtio header %x; want GSO TCPv4 size 1000", i, p[:vnetHdrLen])
		}
		if id := binary.BigEndian.Uint16(ip[4:]); id != 1000+uint16(4*i) {
			t.Errorf("piece %d: IP id %d; want %d", i, id, 1000+4*i)
		}
		if tl := int(binary.BigEndian.Uint16(ip[2:])); tl != len(ip) {
			t.Errorf("piece %d: total length %d; want %d", i, tl, len(ip))
		}
		got = append(got, ip[40:]...)
	}
	if !bytes.Equal(got, payload) {
		t.Error("reassembled payload differs")
	}
}

func FuzzSplitGSO(f *testing.F) {
	f.Add(gsoPacket(make([]byte, 3000), 1448, 0x18), 1)
	f.Add(gsoPacket(make([]byte, 100), 50, 0x11), 3)
	f.Fuzz(func(t *testing.T, pkt []byte, segs int) {
		if segs < 0 || segs > 100 {
			return
		}
		total := 0
		err := splitGSO(pkt, segs, func(n int) []byte { return make([]byte, n) }, func(s []byte) {
			total += len(s)
		})
		if err == nil && total == 0 {
			t.Error("splitGSO succeeded without emitting anything")
		}
	})
}

func TestWireBytes(t *testing.T) {
	pkt := gsoPacket(make([]byte, 4000), 1448, 0x10) // 3 segments, 40-byte headers
	if got, want := wireBytes(pkt, true), 4000+3*40; got != want {
		t.Errorf("wireBytes(GSO 3 segments) = %d; want %d", got, want)
	}
	pkt[1] = gsoNone
	if got, want := wireBytes(pkt, true), 4040; got != want {
		t.Errorf("wireBytes(plain) = %d; want %d", got, want)
	}
}
