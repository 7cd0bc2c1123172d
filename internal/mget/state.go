package mget

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/mosto-net/mosto/internal/atomicfile"
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

// saveState syncs the data written so far, then records it: the state
// never claims bytes that are not on disk.
func (d *dl) saveState() error {
	d.mu.Lock()
	if d.sched == nil {
		d.mu.Unlock()
		return nil
	}
	st := state{Identity: d.id, Block: d.sched.BlockSize(), Got: d.sched.Got()}
	d.mu.Unlock()
	if err := d.file.Sync(); err != nil {
		return fmt.Errorf("mget: %w", err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("mget: %w", err)
	}
	if err := atomicfile.Write(statePath(d.cfg.Out), b, 0o644); err != nil {
		return fmt.Errorf("mget: %w", err)
	}
	return nil
}
