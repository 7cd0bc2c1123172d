package mget

import (
	"testing"
	"time"
)

// TestWindowAfterSilence: the window follows a rise of the last sample at
// once and a fall slowly; a session back from a silence starts from the
// rate the sub-flow had when it last received (not from its EWMA decayed
// by the silence) and measures its own rate after warmFor.
func TestWindowAfterSilence(t *testing.T) {
	const block = 128 << 10
	d := &dl{cfg: Config{Block: block, MaxWindow: 16 << 20}, leaders: map[string]*sub{}}
	s := &sub{srtt: 50 * time.Millisecond}
	d.subs = []*sub{s}
	if w := d.windowLocked(s); w != 2*block {
		t.Fatalf("window before any sample = %d, want 2 ranges (%d)", w, 2*block)
	}
	feed := func(bytesPerSample int64, n int) {
		for range n {
			s.st.Bytes += bytesPerSample
			d.sampleRatesLocked()
		}
	}
	// 3 MB/s for 2 s: the window holds 250 ms of it plus a range.
	feed(300_000, 20)
	want := int64(3e6*minWindowTime.Seconds()) + block
	if w := d.windowLocked(s); w < want*95/100 || w > want*105/100 {
		t.Fatalf("window at 3 MB/s = %d, want about %d", w, want)
	}
	// A rise to 6 MB/s shows in the window after one sample.
	feed(600_000, 1)
	if w, low := d.windowLocked(s), int64(6e6*minWindowTime.Seconds())+block; w < low {
		t.Fatalf("window one sample into 6 MB/s = %d, want >= %d", w, low)
	}
	feed(300_000, 20)
	// Silent for 7 s: the EWMA decays to nothing.
	feed(0, 70)
	if s.rate > 1e3 {
		t.Fatalf("EWMA after 7 s of silence = %.0f B/s, want ~0", s.rate)
	}
	// The session that follows (what session does when it goes live, with
	// an hour for warmFor so that a descheduled test cannot outlive it)
	// starts from the rate before the silence.
	s.warm, s.warmUntil = s.active, time.Now().Add(time.Hour)
	if w := d.windowLocked(s); w < want*95/100 {
		t.Fatalf("window of the session after the silence = %d, want about %d (the rate before it)", w, want)
	}
	// Once warmFor is over, its own (here: low) rate rules.
	s.warmUntil = time.Now().Add(-time.Millisecond)
	feed(10_000, 20)
	if w, high := d.windowLocked(s), int64(0.2e6*minWindowTime.Seconds())+block; w > high {
		t.Fatalf("window at 0.1 MB/s after warmFor = %d, want <= %d", w, high)
	}
}
