package emu

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// vnetHdrLen is the size of struct virtio_net_hdr, which precedes every
// packet read from or written to a TUN device opened with IFF_VNET_HDR.
const vnetHdrLen = 10

// openTUN creates a TUN device called name in the calling thread's network
// namespace and returns its non-blocking file descriptor. With offload the device
// carries a virtio-net header and accepts checksum and TSO offloads, so the
// kernel hands over GSO super-packets of up to 64 KB.
func openTUN(name string, offload bool) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("tun name %q: %w", name, err)
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if offload {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	if offload {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnetHdrLen); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("TUNSETVNETHDRSZ %s: %w", name, err)
		}
		off := unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETOFFLOAD, uintptr(off)); e != 0 {
			unix.Close(fd)
			return -1, fmt.Errorf("TUNSETOFFLOAD %s: %w", name, e)
		}
	}
	return fd, nil
}
