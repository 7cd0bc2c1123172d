//go:build linux && (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64)

package xlate

// Pinning and port reservation.
//
// With Config.PinDir the two maps (joins, counters) and one tcx link per
// interface are pinned in bpffs: the program stays attached and its entries
// keep translating when the process dies, so joined flows survive a killed
// relay. Open with the same PinDir adopts what it finds: the maps are
// reused (entries and counters intact), each pinned link is switched to the
// newly loaded program (bpf_link_update: no gap), links of interfaces no
// longer configured are detached, and the sweeper takes the adopted joins
// over (they end as any other: FIN both ways or RST + CloseLinger, or
// IdleTimeout). Maps that no longer fit the program (another MaxEntries or
// layout) are removed with their links: those flows end with a RST from
// this host's stack. Close removes the pins (a clean shutdown leaves nothing
// behind); only a process that dies without Close leaves them.
//
// Reservation: the local port of a joined connection must not be reused
// by a new connection of this host with the same 4-tuple while the join
// lives (its packets would be translated). Join keeps a duplicate of both
// sockets open, silent in TCP_REPAIR mode, until the join is removed; a
// restarted process recreates them for the joins it adopts (a socket in
// TCP_REPAIR mode binds and connects without a SYN). The kernel then
// refuses the 4-tuple to new connections (connect with that local port
// fails with EADDRNOTAVAIL, an explicit bind with EADDRINUSE).

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultBPFFS is where bpffs is mounted by convention; Open mounts it
// there when a PinDir below it is not on a bpffs yet.
const DefaultBPFFS = "/sys/fs/bpf"

const bpffsMagic = 0xcafe4a11

// pinnedMaps are the maps pinned by name in PinDir.
var pinnedMaps = []string{"joins", "counters"}

// ensureBPFFS makes sure dir can hold pins: its nearest existing ancestor
// must be on a bpffs; if it is not and dir lies below DefaultBPFFS, a
// bpffs is mounted at DefaultBPFFS. dir is created.
func ensureBPFFS(dir string, log *slog.Logger) error {
	p := filepath.Clean(dir)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if uint32(st.Type) == bpffsMagic {
				return mkdirPins(dir)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("xlate: pin dir %s: %w", dir, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	if rel, err := filepath.Rel(DefaultBPFFS, filepath.Clean(dir)); err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("xlate: pin dir %s is not on a bpffs (mount one: mount -t bpf bpf DIR)", dir)
	}
	if err := unix.Mount("bpf", DefaultBPFFS, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("xlate: mount bpffs at %s: %w", DefaultBPFFS, err)
	}
	if privateMountNS() {
		log.Warn("bpffs mounted in a private mount namespace: the pins live only as long as it does (run the relay with nsenter --net, not ip netns exec, or mount bpffs first)", "at", DefaultBPFFS)
	} else {
		log.Info("bpffs mounted", "at", DefaultBPFFS)
	}
	return mkdirPins(dir)
}

func mkdirPins(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("xlate: pin dir: %w", err)
	}
	return nil
}

// privateMountNS reports whether this process lives in another mount
// namespace than init.
func privateMountNS() bool {
	var a, b unix.Stat_t
	if unix.Stat("/proc/self/ns/mnt", &a) != nil || unix.Stat("/proc/1/ns/mnt", &b) != nil {
		return false
	}
	return a.Ino != b.Ino
}

// linkPin is the pin of the tcx link on one interface (its index is part
// of the name: a recreated device with the same name gets a fresh link).
func linkPin(dir string, ifindex int, name string) string {
	return filepath.Join(dir, "tcx-"+strconv.Itoa(ifindex)+"-"+name)
}

// loadPinned loads the program into s.objs, reusing the pinned maps of
// dir; maps that do not fit are removed with their links (and flows).
func (s *Splicer) loadPinned(spec *ebpf.CollectionSpec, dir string) error {
	for _, m := range pinnedMaps {
		spec.Maps[m].Pinning = ebpf.PinByName
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	err := spec.LoadAndAssign(&s.objs, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		s.log.Warn("pinned xlate maps do not fit this program: removing them and their links (their flows end)", "dir", dir, "err", err)
		if rerr := removePins(dir); rerr != nil {
			return rerr
		}
		err = spec.LoadAndAssign(&s.objs, opts)
	}
	if err != nil {
		return fmt.Errorf("xlate: load program: %w", err)
	}
	return nil
}

// attachPinned attaches prog to ifi's tcx ingress, taking over the link
// pinned there by an earlier process when there is one.
func (s *Splicer) attachPinned(ifindex int, name string, prog *ebpf.Program) (link.Link, error) {
	path := linkPin(s.cfg.PinDir, ifindex, name)
	if old, err := link.LoadPinnedLink(path, nil); err == nil {
		if err := old.Update(prog); err == nil {
			s.log.Info("xlate link adopted", "interface", name)
			return old, nil
		} else {
			s.log.Warn("pinned xlate link not reusable, attaching anew", "interface", name, "err", err)
		}
		old.Unpin()
		old.Close()
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return nil, err
	}
	if err := l.Pin(path); err != nil {
		l.Close()
		return nil, fmt.Errorf("pin: %w", err)
	}
	return l, nil
}

// dropStaleLinks detaches pinned links of interfaces this Splicer does not
// use (removed from the configuration, or recreated devices).
func (s *Splicer) dropStaleLinks(keep map[string]bool) {
	ents, _ := os.ReadDir(s.cfg.PinDir)
	for _, e := range ents {
		path := filepath.Join(s.cfg.PinDir, e.Name())
		if !strings.HasPrefix(e.Name(), "tcx-") || keep[path] {
			continue
		}
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			l.Unpin()
			l.Close()
		} else {
			os.Remove(path)
		}
		s.log.Info("stale xlate link detached", "pin", path)
	}
}

// removePins detaches every pinned link of dir and removes its pins.
func removePins(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("xlate: pin dir: %w", err)
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), "tcx-") {
			if l, err := link.LoadPinnedLink(path, nil); err == nil {
				l.Unpin()
				l.Close()
				continue
			}
		}
		os.Remove(path)
	}
	return nil
}

// unpinAll removes this Splicer's pins (Close).
func (s *Splicer) unpinAll() {
	if s.cfg.PinDir == "" {
		return
	}
	for _, l := range s.links {
		l.Unpin()
	}
	for _, m := range []*ebpf.Map{s.objs.Joins, s.objs.Counters} {
		if m != nil {
			m.Unpin()
		}
	}
	removePins(s.cfg.PinDir)
	os.Remove(s.cfg.PinDir)
}

// adopt rebuilds the pairs of the joins found in the (pinned) map and
// reserves their tuples; an entry without its reverse is removed.
func (s *Splicer) adopt() int {
	var k xlateTuple
	var v xlateEntry
	ins := map[Tuple]Tuple{}
	held := map[Tuple]bool{}
	it := s.objs.Joins.Iterate()
	for it.Next(&k, &v) {
		ins[keyTuple(k)] = keyTuple(v.Out).Reverse()
		if v.Flags&fHold != 0 {
			held[keyTuple(k)] = true
		}
	}
	n := 0
	for in, rev := range ins {
		if held[in] || held[rev] {
			// Killed inside a join's install: its sockets are gone and
			// whether the join was consistent is unknown. Without the
			// entries the peers get a RST from this host's stack.
			k := tupleKey(in)
			s.objs.Joins.Delete(&k)
			s.log.Warn("xlate: removed a pinned entry whose install did not finish", "in", in)
			continue
		}
		if back, ok := ins[rev]; !ok || back != in {
			k := tupleKey(in)
			s.objs.Joins.Delete(&k)
			s.log.Warn("xlate: removed a pinned entry without its reverse", "in", in)
			continue
		}
		s.pairs[in] = rev
		if fd, err := reserveTuple(in); err == nil {
			s.held[in] = fd
		} else {
			s.reserveFailed.Add(1)
			s.log.Warn("xlate: cannot reserve an adopted join's tuple", "tuple", in, "err", err)
		}
		if in.Src.Compare(rev.Src) < 0 {
			n++
		}
	}
	return n
}

// reserveTuple creates a silent socket (TCP_REPAIR: no SYN, no FIN, no
// RST) that occupies the 4-tuple of in (Dst local, Src remote).
func reserveTuple(in Tuple) (int, error) {
	family := unix.AF_INET
	var local, remote unix.Sockaddr
	if in.Dst.Addr().Is4() {
		local = &unix.SockaddrInet4{Addr: in.Dst.Addr().As4(), Port: int(in.Dst.Port())}
		remote = &unix.SockaddrInet4{Addr: in.Src.Addr().As4(), Port: int(in.Src.Port())}
	} else {
		family = unix.AF_INET6
		local = &unix.SockaddrInet6{Addr: in.Dst.Addr().As16(), Port: int(in.Dst.Port())}
		remote = &unix.SockaddrInet6{Addr: in.Src.Addr().As16(), Port: int(in.Src.Port())}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, err
	}
	if err := setRepair(fd, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TCP_REPAIR: %w", err)
	}
	if err := unix.Bind(fd, local); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind: %w", err)
	}
	if err := unix.Connect(fd, remote); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect: %w", err)
	}
	return fd, nil
}

// holdFD keeps a duplicate of a joined socket (in TCP_REPAIR mode) open:
// its 4-tuple stays taken while the join lives.
func holdFD(fd int) (int, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	// No keepalive probes from a socket that is not in the data path.
	unix.SetsockoptInt(d, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 0)
	return d, nil
}

// PinnedEntry is one entry found in a pin directory.
type PinnedEntry struct {
	In, Out Tuple
	Stats   EntryStats
}

// ReadPinned lists the entries pinned in dir (by a running or a dead
// process), for inspection.
func ReadPinned(dir string) ([]PinnedEntry, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "joins"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("xlate: pinned joins: %w", err)
	}
	defer m.Close()
	var out []PinnedEntry
	var k xlateTuple
	var v xlateEntry
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, PinnedEntry{In: keyTuple(k), Out: keyTuple(v.Out), Stats: entryStats(v)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("xlate: pinned joins: %w", err)
	}
	return out, nil
}
