package metrics

import (
	"bytes"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// RegisterRuntime registers the Go runtime series (go_*) and the process
// series (process_*) with the names, types and HELP texts of
// client_golang's Go and process collectors. They are read when gathered.
func (r *Registry) RegisterRuntime() {
	names := make([]string, 0, len(memStats)+len(goSeries)+len(processSeries))
	for _, m := range memStats {
		names = append(names, m.name)
	}
	for _, s := range goSeries {
		names = append(names, s.name)
	}
	for _, s := range processSeries {
		names = append(names, s.name)
	}
	r.register(runtimeCollector{}, names...)
}

type seriesDesc struct {
	name, help string
	typ        Type
}

var goSeries = [...]seriesDesc{
	{"go_gc_duration_seconds", "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.", TypeSummary},
	{"go_gc_gogc_percent", "Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.", TypeGauge},
	{"go_gc_gomemlimit_bytes", "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.", TypeGauge},
	{"go_goroutines", "Number of goroutines that currently exist.", TypeGauge},
	{"go_info", "Information about the Go environment.", TypeGauge},
	{"go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads.", TypeGauge},
	{"go_threads", "Number of OS threads created.", TypeGauge},
}

var processSeries = [...]seriesDesc{
	{"process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", TypeCounter},
	{"process_max_fds", "Maximum number of open file descriptors.", TypeGauge},
	{"process_network_receive_bytes_total", "Number of bytes received by the process over the network.", TypeCounter},
	{"process_network_transmit_bytes_total", "Number of bytes sent by the process over the network.", TypeCounter},
	{"process_open_fds", "Number of open file descriptors.", TypeGauge},
	{"process_resident_memory_bytes", "Resident memory size in bytes.", TypeGauge},
	{"process_start_time_seconds", "Start time of the process since unix epoch in seconds.", TypeGauge},
	{"process_virtual_memory_bytes", "Virtual memory size in bytes.", TypeGauge},
	{"process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", TypeGauge},
}

var memStats = [...]struct {
	name, help string
	typ        Type
	v          func(*runtime.MemStats) float64
}{
	{"go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.Alloc) }},
	{"go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes.", TypeCounter, func(m *runtime.MemStats) float64 { return float64(m.TotalAlloc) }},
	{"go_memstats_buck_hash_sys_bytes", "Number of bytes used by the profiling bucket hash table. Equals to /memory/classes/profiling/buckets:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.BuckHashSys) }},
	{"go_memstats_frees_total", "Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects.", TypeCounter, func(m *runtime.MemStats) float64 { return float64(m.Frees) }},
	{"go_memstats_gc_sys_bytes", "Number of bytes used for garbage collection system metadata. Equals to /memory/classes/metadata/other:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.GCSys) }},
	{"go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapAlloc) }},
	{"go_memstats_heap_idle_bytes", "Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapIdle) }},
	{"go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapInuse) }},
	{"go_memstats_heap_objects", "Number of currently allocated objects. Equals to /gc/heap/objects:objects.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapObjects) }},
	{"go_memstats_heap_released_bytes", "Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapReleased) }},
	{"go_memstats_heap_sys_bytes", "Number of heap bytes obtained from system. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes + /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapSys) }},
	{"go_memstats_last_gc_time_seconds", "Number of seconds since 1970 of last garbage collection.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.LastGC) / 1e9 }},
	{"go_memstats_mallocs_total", "Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects.", TypeCounter, func(m *runtime.MemStats) float64 { return float64(m.Mallocs) }},
	{"go_memstats_mcache_inuse_bytes", "Number of bytes in use by mcache structures. Equals to /memory/classes/metadata/mcache/inuse:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MCacheInuse) }},
	{"go_memstats_mcache_sys_bytes", "Number of bytes used for mcache structures obtained from system. Equals to /memory/classes/metadata/mcache/inuse:bytes + /memory/classes/metadata/mcache/free:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MCacheSys) }},
	{"go_memstats_mspan_inuse_bytes", "Number of bytes in use by mspan structures. Equals to /memory/classes/metadata/mspan/inuse:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MSpanInuse) }},
	{"go_memstats_mspan_sys_bytes", "Number of bytes used for mspan structures obtained from system. Equals to /memory/classes/metadata/mspan/inuse:bytes + /memory/classes/metadata/mspan/free:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MSpanSys) }},
	{"go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.NextGC) }},
	{"go_memstats_other_sys_bytes", "Number of bytes used for other system allocations. Equals to /memory/classes/other:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.OtherSys) }},
	{"go_memstats_stack_inuse_bytes", "Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.StackInuse) }},
	{"go_memstats_stack_sys_bytes", "Number of bytes obtained from system for stack allocator. Equals to /memory/classes/heap/stacks:bytes + /memory/classes/os-stacks:bytes.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.StackSys) }},
	{"go_memstats_sys_bytes", "Number of bytes obtained from system. Equals to /memory/classes/total:byte.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.Sys) }},
}

// runtimeCollector gathers the go_* and process_* series.
type runtimeCollector struct{}

func (runtimeCollector) collect(add func(Family)) {
	one := func(d seriesDesc, v float64) {
		add(Family{Name: d.name, Help: d.help, Type: d.typ, Series: []Series{{Value: v}}})
	}
	// Go runtime.
	var gc debug.GCStats
	gc.PauseQuantiles = make([]time.Duration, 5)
	debug.ReadGCStats(&gc)
	qs := make([]Quantile, len(gc.PauseQuantiles))
	for i, p := range gc.PauseQuantiles {
		qs[i] = Quantile{Q: float64(i) / float64(len(qs)-1), Value: p.Seconds()}
	}
	add(Family{Name: goSeries[0].name, Help: goSeries[0].help, Type: TypeSummary,
		Series: []Series{{Quantiles: qs, Count: uint64(gc.NumGC), Sum: gc.PauseTotal.Seconds()}}})
	one(goSeries[1], float64(gogcPercent(os.Getenv("GOGC"))))
	one(goSeries[2], float64(debug.SetMemoryLimit(-1)))
	one(goSeries[3], float64(runtime.NumGoroutine()))
	add(Family{Name: goSeries[4].name, Help: goSeries[4].help, Type: TypeGauge,
		Series: []Series{{Labels: []Label{{"version", runtime.Version()}}, Value: 1}}})
	one(goSeries[5], float64(runtime.GOMAXPROCS(0)))
	threads, _ := runtime.ThreadCreateProfile(nil)
	one(goSeries[6], float64(threads))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for _, m := range memStats {
		add(Family{Name: m.name, Help: m.help, Type: m.typ, Series: []Series{{Value: m.v(&ms)}}})
	}

	// Process, from /proc (a series that cannot be read is left out).
	p := readProc()
	for i, v := range []float64{p.cpu, p.maxFDs, p.rx, p.tx, p.openFDs, p.rss, p.start, p.vsize, p.maxVsize} {
		if !math.IsNaN(v) {
			one(processSeries[i], v)
		}
	}
}

// gogcPercent is the GC percentage the runtime takes from GOGC (mosto
// never calls debug.SetGCPercent): 100 by default, -1 for off.
func gogcPercent(env string) int {
	if env == "off" {
		return -1
	}
	if n, err := strconv.Atoi(env); err == nil {
		return n
	}
	return 100
}

// procValues are the process series; NaN: not readable.
type procValues struct {
	cpu, maxFDs, rx, tx, openFDs, rss, start, vsize, maxVsize float64
}

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ, 100 on every
// Linux architecture Go supports).
const userHZ = 100

func readProc() procValues {
	nan := math.NaN()
	p := procValues{nan, nan, nan, nan, nan, nan, nan, nan, nan}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		// Fields after the command name, which is in parentheses and may
		// hold spaces: state is field 3, so f[i] is field i+3.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 21 {
				utime, _ := strconv.ParseFloat(f[11], 64)
				stime, _ := strconv.ParseFloat(f[12], 64)
				p.cpu = (utime + stime) / userHZ
				if v, err := strconv.ParseFloat(f[20], 64); err == nil {
					p.vsize = v
				}
				if v, err := strconv.ParseFloat(f[21], 64); err == nil {
					p.rss = v * float64(os.Getpagesize())
				}
				if st, err := strconv.ParseFloat(f[19], 64); err == nil {
					if bt := bootTime(); bt > 0 {
						p.start = bt + st/userHZ
					}
				}
			}
		}
	}
	if d, err := os.Open("/proc/self/fd"); err == nil {
		names, err := d.Readdirnames(-1)
		d.Close()
		if err == nil {
			p.openFDs = float64(len(names) - 1) // without the one reading it
		}
	}
	if b, err := os.ReadFile("/proc/self/limits"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			for _, lim := range [...]struct {
				prefix string
				dst    *float64
			}{{"Max open files", &p.maxFDs}, {"Max address space", &p.maxVsize}} {
				rest, ok := strings.CutPrefix(line, lim.prefix)
				f := strings.Fields(rest) // soft limit, hard limit, unit
				if !ok || len(f) == 0 {
					continue
				}
				if f[0] == "unlimited" {
					*lim.dst = math.MaxUint64
				} else if v, err := strconv.ParseFloat(f[0], 64); err == nil {
					*lim.dst = v
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/net/netstat"); err == nil {
		p.rx, p.tx = netOctets(string(b))
	}
	return p
}

// bootTime is the btime of /proc/stat (0 if not readable).
func bootTime() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// netOctets reads InOctets and OutOctets of the IpExt lines of
// /proc/PID/net/netstat (a header line of names, then a line of values).
func netOctets(s string) (rx, tx float64) {
	rx, tx = math.NaN(), math.NaN()
	var names []string
	for line := range strings.SplitSeq(s, "\n") {
		rest, ok := strings.CutPrefix(line, "IpExt:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if i >= len(f) {
				break
			}
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch n {
			case "InOctets":
				rx = v
			case "OutOctets":
				tx = v
			}
		}
		return rx, tx
	}
	return rx, tx
}
