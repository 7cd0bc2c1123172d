package mget

import (
	"encoding/json"
	"fmt"
	"os"
)

// state is the resume file next to a partial download: which bytes of which
// version it holds.
type state struct {
	Identity Identity `json:"identity"`
	Block    int64    `json:"block"`
	Got      []int64  `json:"got"` // bytes held from the start of each block
}

func statePath(out string) string { return out + ".mget" }

func loadState(path string) (*state, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("mget: resume file %s: %w", path, err)
	}
	if st.Block <= 0 || st.Identity.Size < 0 || int64(len(st.Got)) != (st.Identity.Size+st.Block-1)/st.Block {
		return nil, fmt.Errorf("mget: resume file %s is inconsistent", path)
	}
	return &st, nil
}

// saveState records the bytes written so far. Every byte it claims was
// written (WriteAt returned) before, and the file is replaced by a rename,
// so a killed client resumes correctly: the kernel keeps written pages.
// Nothing is fsync'd (like curl and aria2c): after a machine crash the
// claim may run ahead of the disk, which --sha256 would catch. (An fsync
// per save took seconds on a loaded machine and delayed the end of a
// download that finished meanwhile.)
func (d *dl) saveState() error {
	d.mu.Lock()
	if d.sched == nil {
		d.mu.Unlock()
		return nil
	}
	st := state{Identity: d.id, Block: d.sched.BlockSize(), Got: d.sched.Got()}
	d.mu.Unlock()
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("mget: %w", err)
	}
	path := statePath(d.cfg.Out)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("mget: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mget: %w", err)
	}
	return nil
}
