package proxybench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cpuCap is a CPU cgroup the relays run in, so the connection-rate test
// can give every relay the same CPU budget (CFS bandwidth: quota per
// period). It works with cgroup v2 (cpu.max) and the v1 cpu controller
// (cpu.cfs_quota_us), and needs write access to the cgroup tree (root).
type cpuCap struct {
	dir    string // the cgroup's directory
	parent string // where its processes go back on remove
	v2     bool
	period time.Duration
}

// DefaultCapPeriod is the CFS period of the capped cgroups. The kernel
// hands a cgroup's quota to its CPUs in slices of 5 ms
// (sched_cfs_bandwidth_slice_us): with a 10 ms period and 0.5 CPU (5 ms
// of quota) the first CPU to run takes the whole quota, so a relay with
// two threads was throttled unevenly (HAProxy used 0.43 of its 0.5 CPU).
// A 100 ms period holds ten slices per CPU budget.
const DefaultCapPeriod = 100 * time.Millisecond

// newCPUCap creates an unlimited cgroup for the relays, whose quota will
// be counted per period (0: DefaultCapPeriod).
func newCPUCap(period time.Duration) (*cpuCap, error) {
	if period <= 0 {
		period = DefaultCapPeriod
	}
	var id [4]byte
	rand.Read(id[:])
	name := "mosto-bench-" + hex.EncodeToString(id[:])
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		if !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " cpu ") {
			return nil, errors.New("cgroup v2 without the cpu controller")
		}
		// Child cgroups get the cpu controller only if the root delegates it.
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu"), 0); err != nil {
			return nil, fmt.Errorf("enable cpu controller: %w", err)
		}
		c := &cpuCap{dir: filepath.Join("/sys/fs/cgroup", name), parent: "/sys/fs/cgroup", v2: true, period: period}
		if err := os.Mkdir(c.dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		return c, nil
	}
	root := "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		return nil, errors.New("no cgroup cpu controller (neither v2 nor v1 /sys/fs/cgroup/cpu)")
	}
	c := &cpuCap{dir: filepath.Join(root, name), parent: root, period: period}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	return c, nil
}

// add moves the processes (all their threads) into the cgroup; their
// children started later inherit it.
func (c *cpuCap) add(pids []int) error {
	for _, p := range pids {
		if err := os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(p)), 0); err != nil {
			return fmt.Errorf("move pid %d into %s: %w", p, c.dir, err)
		}
	}
	return nil
}

// Weights of a capped cgroup: the largest the kernel accepts, so that on a
// machine busy with other work the quota, not the competition for CPU,
// bounds the relay (a capped relay's cgroup is a sibling of everything
// else running). Uncapped, the default weight.
const (
	capWeightV2     = "10000"
	defaultWeightV2 = "100"
	capSharesV1     = "262144"
	defaultSharesV1 = "1024"
)

// set limits the cgroup to cpus CPUs (0: unlimited) and gives it the
// largest CPU weight while capped.
func (c *cpuCap) set(cpus float64) error {
	period := c.period.Microseconds()
	quota := int64(cpus * float64(period))
	weightFile, weight := "cpu.weight", defaultWeightV2
	if !c.v2 {
		weightFile, weight = "cpu.shares", defaultSharesV1
	}
	if cpus > 0 {
		weight = capWeightV2
		if !c.v2 {
			weight = capSharesV1
		}
	}
	if err := os.WriteFile(filepath.Join(c.dir, weightFile), []byte(weight), 0); err != nil {
		return fmt.Errorf("set %s: %w", weightFile, err)
	}
	if c.v2 {
		v := fmt.Sprintf("max %d", period)
		if cpus > 0 {
			v = fmt.Sprintf("%d %d", quota, period)
		}
		return os.WriteFile(filepath.Join(c.dir, "cpu.max"), []byte(v), 0)
	}
	if cpus <= 0 {
		quota = -1
	}
	// The quota goes first when it shrinks below the old period's, so the
	// pair never is invalid in between; -1 is always valid.
	if err := os.WriteFile(filepath.Join(c.dir, "cpu.cfs_quota_us"), []byte("-1"), 0); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cpu.cfs_period_us"), []byte(strconv.FormatInt(period, 10)), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0)
}

// boost gives the cgroup the largest CPU weight and no quota: for the
// load generator (this process: clients and sink) while the relays run
// capped, so that on a machine busy with other work the clients can offer
// the capped relays enough connections to reach their cap.
func (c *cpuCap) boost() error {
	if err := c.set(0); err != nil {
		return err
	}
	weightFile, weight := "cpu.weight", capWeightV2
	if !c.v2 {
		weightFile, weight = "cpu.shares", capSharesV1
	}
	return os.WriteFile(filepath.Join(c.dir, weightFile), []byte(weight), 0)
}

// remove moves any process left back to the parent and deletes the
// cgroup.
func (c *cpuCap) remove() error {
	if b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs")); err == nil {
		for _, f := range strings.Fields(string(b)) {
			os.WriteFile(filepath.Join(c.parent, "cgroup.procs"), []byte(f), 0)
		}
	}
	// A process that just exited may hold the cgroup briefly.
	var err error
	for range 20 {
		if err = os.Remove(c.dir); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", c.dir, err)
}
