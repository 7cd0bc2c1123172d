package relay

import (
	"fmt"
	"net/http"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// servePProf serves Go's profiles for `metrics.pprof`, in the paths and
// formats `go tool pprof` expects: /debug/pprof/profile?seconds=N (CPU,
// default 30, at most 300), /debug/pprof/<name>[?debug=1|2] for the named
// profiles (goroutine, heap, allocs, block, mutex, threadcreate), and an
// index at /debug/pprof/. It uses runtime/pprof directly: net/http/pprof's
// package initialisation and dependencies cost every `mosto` command idle
// memory.
func servePProf(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/debug/pprof/")
	switch name {
	case "":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "profile?seconds=N")
		for _, p := range pprof.Profiles() {
			fmt.Fprintf(w, "%s (%d)\n", p.Name(), p.Count())
		}
	case "profile":
		sec, err := strconv.Atoi(r.FormValue("seconds"))
		if err != nil || sec <= 0 {
			sec = 30
		}
		sec = min(sec, 300)
		w.Header().Set("Content-Type", "application/octet-stream")
		if err := pprof.StartCPUProfile(w); err != nil {
			http.Error(w, fmt.Sprintf("cpu profile: %v", err), http.StatusInternalServerError)
			return
		}
		t := time.NewTimer(time.Duration(sec) * time.Second)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		pprof.StopCPUProfile()
	default:
		p := pprof.Lookup(name)
		if p == nil {
			http.NotFound(w, r)
			return
		}
		debug, _ := strconv.Atoi(r.FormValue("debug"))
		if debug == 0 {
			w.Header().Set("Content-Type", "application/octet-stream")
		} else {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		p.WriteTo(w, debug)
	}
}
