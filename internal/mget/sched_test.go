package mget

import (
	"math/rand/v2"
	"testing"
)

// liveReq is a request in flight in the model: it has received the bytes
// [sp.Off, pos).
type liveReq struct {
	sub int
	sp  Span
	pos int64
}

// TestSchedModel drives Sched with random sub-flows (issue, partial
// delivery, completion, failure) and checks it against a byte-level model
// after every step: every request starts at bytes not yet received and
// within the object; outside the end game no byte is in two requests at
// once and each request takes the lowest idle block, so fresh blocks are
// first requested in ascending order; the end game starts only when no
// block is idle and duplicates only for a faster sub-flow; at the end every
// byte has been received.
func TestSchedModel(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 17))
		size := int64(rng.IntN(4000))
		bsize := int64(1 + rng.IntN(600))
		nsub := 1 + rng.IntN(5)
		speed := make([]int, nsub)
		for i := range speed {
			speed[i] = 1 + rng.IntN(10)
		}
		faster := func(sub int) func(int) bool {
			return func(o int) bool { return speed[sub] > speed[o] }
		}
		// Resume from a random partial state sometimes.
		var got []int64
		recv := make([]bool, size)
		nb := int((size + bsize - 1) / bsize)
		if rng.IntN(3) == 0 {
			got = make([]int64, nb)
			for i := range got {
				l := min(bsize, size-int64(i)*bsize)
				got[i] = rng.Int64N(l + 1)
				for k := int64(0); k < got[i]; k++ {
					recv[int64(i)*bsize+k] = true
				}
			}
		}
		s := NewSched(size, bsize, got)
		var live []*liveReq
		lastFresh := -1
		issued := make([]bool, nb)
		for i := range issued {
			issued[i] = got != nil && got[i] > 0
		}
		idleBlock := func() int { // lowest block with a missing byte and no request
			for i := 0; i < nb; i++ {
				start, end := int64(i)*bsize, min(int64(i+1)*bsize, size)
				missing := false
				for k := start; k < end; k++ {
					if !recv[k] {
						missing = true
						break
					}
				}
				if !missing {
					continue
				}
				owned := false
				for _, r := range live {
					if r.sp.Block == i {
						owned = true
					}
				}
				if !owned {
					return i
				}
			}
			return -1
		}
		for step := 0; !s.Done(); step++ {
			if step > 200000 {
				t.Fatalf("seed %d: no progress after %d steps (size %d, block %d, %d subs)", seed, step, size, bsize, nsub)
			}
			sub := rng.IntN(nsub)
			switch op := rng.IntN(10); {
			case op < 4: // issue
				want := idleBlock()
				sp, ok := s.Next(sub, faster(sub))
				if !ok {
					if want >= 0 {
						t.Fatalf("seed %d: Next gave nothing while block %d is idle", seed, want)
					}
					continue
				}
				if sp.Off < 0 || sp.End > size || sp.Off >= sp.End || sp.Off < int64(sp.Block)*bsize || sp.End > int64(sp.Block+1)*bsize {
					t.Fatalf("seed %d: span %+v outside block / object (size %d, block %d)", seed, sp, size, bsize)
				}
				for k := sp.Off; k < sp.End; k++ {
					if recv[k] && !sp.Dup {
						t.Fatalf("seed %d: span %+v requests byte %d already received", seed, sp, k)
					}
				}
				if !sp.Dup {
					if sp.Block != want {
						t.Fatalf("seed %d: Next gave block %d; the lowest idle block is %d", seed, sp.Block, want)
					}
					for _, r := range live {
						if r.sp.Block == sp.Block {
							t.Fatalf("seed %d: block %d requested twice outside the end game", seed, sp.Block)
						}
					}
					if !issued[sp.Block] {
						if sp.Block < lastFresh {
							t.Fatalf("seed %d: fresh block %d after fresh block %d: not ascending", seed, sp.Block, lastFresh)
						}
						lastFresh = sp.Block
					}
				} else {
					if want >= 0 {
						t.Fatalf("seed %d: end-game duplicate of block %d while block %d is idle", seed, sp.Block, want)
					}
					n := 0
					for _, r := range live {
						if r.sp.Block == sp.Block {
							n++
							if r.sub == sub || speed[sub] <= speed[r.sub] {
								t.Fatalf("seed %d: sub %d (speed %d) duplicates block %d held by sub %d (speed %d)", seed, sub, speed[sub], sp.Block, r.sub, speed[r.sub])
							}
						}
					}
					if n == 0 || n >= s.MaxDup {
						t.Fatalf("seed %d: duplicate of block %d with %d owners", seed, sp.Block, n)
					}
				}
				issued[sp.Block] = true
				live = append(live, &liveReq{sub: sub, sp: sp, pos: sp.Off})
			case op < 8: // deliver to a random request of sub
				var mine []int
				for i, r := range live {
					if r.sub == sub {
						mine = append(mine, i)
					}
				}
				if len(mine) == 0 {
					continue
				}
				i := mine[rng.IntN(len(mine))]
				r := live[i]
				n := 1 + rng.Int64N(r.sp.End-r.pos)
				for k := r.pos; k < r.pos+n; k++ {
					recv[k] = true
				}
				r.pos += n
				s.Progress(r.sp, r.pos)
				if r.pos == r.sp.End {
					s.Release(sub, r.sp.Block)
					live = append(live[:i], live[i+1:]...)
				}
			default: // sub fails: its requests go back to the pool
				if rng.IntN(4) != 0 {
					continue
				}
				keep := live[:0]
				for _, r := range live {
					if r.sub == sub {
						s.Release(sub, r.sp.Block)
					} else {
						keep = append(keep, r)
					}
				}
				live = keep
			}
		}
		for k, ok := range recv {
			if !ok {
				t.Fatalf("seed %d: Done but byte %d never received", seed, k)
			}
		}
		if s.Received() != size {
			t.Fatalf("seed %d: Received = %d; want %d", seed, s.Received(), size)
		}
	}
}

func TestSchedResumeAndNothingLeft(t *testing.T) {
	s := NewSched(10, 4, []int64{4, 1, 0})
	sp, ok := s.Next(0, nil)
	if !ok || sp != (Span{Block: 1, Off: 5, End: 8}) {
		t.Fatalf("Next = %+v, %v; want block 1 from byte 5", sp, ok)
	}
	sp2, _ := s.Next(0, nil)
	if sp2 != (Span{Block: 2, Off: 8, End: 10}) {
		t.Fatalf("Next = %+v; want block 2 [8,10)", sp2)
	}
	if _, ok := s.Next(0, nil); ok {
		t.Fatalf("sub 0 got a duplicate of its own blocks")
	}
	if _, ok := s.Next(1, func(int) bool { return false }); ok {
		t.Fatalf("a slower sub-flow got an end-game duplicate")
	}
	d, ok := s.Next(1, nil)
	if !ok || !d.Dup || d.Block != 1 {
		t.Fatalf("end game: Next = %+v, %v; want duplicate of block 1", d, ok)
	}
	s.Progress(d, 8)
	s.Progress(sp2, 10)
	if !s.Done() {
		t.Fatalf("not done after all bytes")
	}
}

// TestSchedClaim: a claimed block (a first range asked before the
// scheduler existed) is owned as if Next had handed it out: Next skips it,
// it is not idle, and once released unfinished it is the next one handed
// out. Blocks that do not exist or are done cannot be claimed.
func TestSchedClaim(t *testing.T) {
	s := NewSched(1000, 100, []int64{0, 0, 0, 100}) // 10 blocks, block 3 done
	for _, tc := range []struct {
		sub, block int
		want       bool
	}{{1, 1, true}, {2, 2, true}, {1, 1, false}, {0, 3, false}, {0, 10, false}, {0, -1, false}} {
		if got := s.Claim(tc.sub, tc.block); got != tc.want {
			t.Errorf("Claim(%d, %d) = %v; want %v", tc.sub, tc.block, got, tc.want)
		}
	}
	var order []int
	for range 3 {
		sp, ok := s.Next(0, nil)
		if !ok || sp.Dup {
			t.Fatalf("Next = %+v, %v", sp, ok)
		}
		order = append(order, sp.Block)
	}
	if order[0] != 0 || order[1] != 4 || order[2] != 5 {
		t.Fatalf("blocks handed out %v beside claimed 1, 2 and done 3; want [0 4 5]", order)
	}
	s.Progress(Span{Block: 1, Off: 100, End: 200}, 150)
	s.Release(1, 1)
	if sp, ok := s.Next(0, nil); !ok || sp.Block != 1 || sp.Off != 150 {
		t.Fatalf("after releasing claimed block 1 half-received: Next = %+v, %v; want block 1 from 150", sp, ok)
	}
}
