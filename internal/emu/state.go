package emu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// State is what a running world records in <StateDir>/<runid>/state.json, for
// `mosto emu exec`, `down` and `gc`.
type State struct {
	RunID     string      `json:"run_id"`
	Name      string      `json:"name,omitempty"`
	PID       int         `json:"pid"`
	StartTime uint64      `json:"start_time"` // of PID, in clock ticks since boot (/proc/PID/stat)
	Hosts     []StateHost `json:"hosts"`
	// AllowedCC is the root tcp_allowed_congestion_control the world found
	// and SetCC what it set it to; gc restores AllowedCC if SetCC is still
	// in place.
	AllowedCC string `json:"allowed_cc,omitempty"`
	SetCC     string `json:"set_cc,omitempty"`
}

// StateHost is one host of a State.
type StateHost struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"`
	NetNS string `json:"netns"`
}

func (w *World) state() State {
	st := State{RunID: w.runID, Name: w.name, PID: os.Getpid(), StartTime: procStartTime(os.Getpid()), AllowedCC: w.restoreCC, SetCC: w.setCC}
	for _, h := range w.hosts {
		st.Hosts = append(st.Hosts, StateHost{Name: h.name, Addr: h.addr.String(), NetNS: h.netns})
	}
	return st
}

func writeState(dir string, st State) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("emu: state dir: %w", err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("emu: write state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "state.json"))
}

// ReadStates returns the states of all worlds recorded under dir.
func ReadStates(dir string) ([]State, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []State
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "state.json"))
		if err != nil {
			continue
		}
		var st State
		if json.Unmarshal(b, &st) == nil && st.RunID == e.Name() {
			out = append(out, st)
		}
	}
	return out, nil
}

// Alive reports whether the process that owns the world still runs.
func (st State) Alive() bool {
	if st.PID <= 0 {
		return false
	}
	if err := syscall.Kill(st.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if procState(st.PID) == 'Z' {
		return false // killed, not yet reaped: its descriptors are closed
	}
	return st.StartTime == 0 || procStartTime(st.PID) == st.StartTime
}

// procState returns the state letter of /proc/PID/stat, or 0.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || len(b) < i+3 {
		return 0
	}
	return b[i+2]
}

// procStartTime returns field 22 of /proc/PID/stat, or 0.
func procStartTime(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// GC removes what dead worlds left behind: state directories whose owner is
// gone, and namespaces named mosto-<runid>-<n> that belong to no live world.
// It returns the namespaces it removed.
func GC(stateDir string, log *slog.Logger) ([]string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	states, err := ReadStates(stateDir)
	if err != nil {
		return nil, fmt.Errorf("emu: gc: %w", err)
	}
	live := make(map[string]bool)
	for _, st := range states {
		if st.Alive() {
			live[st.RunID] = true
			continue
		}
		log.Info("removing dead world", "run", st.RunID, "pid", st.PID)
		if st.SetCC != "" {
			if cur, err := readSysctl(allowedCCKey); err == nil && cur == st.SetCC {
				writeSysctl(allowedCCKey, st.AllowedCC)
			}
		}
		os.RemoveAll(filepath.Join(stateDir, st.RunID))
	}
	// A world writes its state before it creates namespaces, so a namespace
	// without a live state is an orphan.
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("emu: gc: %w", err)
	}
	var removed []string
	var errs []error
	inodes := make(map[uint64]bool)
	var victims []string
	for _, e := range ents {
		name := e.Name()
		f := strings.Split(name, "-")
		if len(f) != 3 || f[0] != "mosto" || !validRunID(f[1]) {
			continue
		}
		if _, err := strconv.Atoi(f[2]); err != nil || live[f[1]] {
			continue
		}
		if ino, err := nsInode(nsPath(name)); err == nil {
			inodes[ino] = true
		}
		victims = append(victims, name)
	}
	killNetnsProcs(inodes)
	for _, name := range victims {
		if err := deleteNetns(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
