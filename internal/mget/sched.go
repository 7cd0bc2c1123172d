package mget

// Span is one range request of the scheduler: bytes [Off, End) of block
// Block. Dup marks an end-game duplicate of a block another sub-flow has in
// flight.
type Span struct {
	Block    int
	Off, End int64
	Dup      bool
}

// Len returns the span's length in bytes.
func (s Span) Len() int64 { return s.End - s.Off }

// block is one fixed-size piece of the object.
type block struct {
	got    int64 // bytes received from the block's start, contiguous
	owners []int // sub-flows with a request for the block in flight
	issued bool  // requested at least once
}

// Sched hands out byte ranges of one object to sub-flows, receiver-driven
// as in seed 003: each request takes the next idle block in ascending order,
// so faster sub-flows simply request more. A block whose request ends
// early (stall, error) goes back to the pool at once with what was received
// kept: the next request for it starts after the received prefix. When no
// block is idle (the end game) a sub-flow may duplicate the lowest
// unfinished block whose owners are all slower than it (see Next). Sched is
// not safe for concurrent use; the client serialises it.
type Sched struct {
	size, bsize int64
	blocks      []block
	low         int // every block below low is done or owned
	left        int // blocks not done
	// MaxDup is the most requests in flight for one block in the end game
	// (default 2).
	MaxDup int
}

// NewSched returns a scheduler of an object of size bytes cut in blocks of
// bsize bytes (the last may be shorter). got, when not nil, gives the bytes
// already held at the start of each block (a resumed download).
func NewSched(size, bsize int64, got []int64) *Sched {
	if bsize <= 0 {
		bsize = 1
	}
	n := int((size + bsize - 1) / bsize)
	s := &Sched{size: size, bsize: bsize, blocks: make([]block, n), MaxDup: 2}
	for i := range s.blocks {
		if i < len(got) {
			s.blocks[i].got = min(max(got[i], 0), s.blockLen(i))
		}
		if !s.done(i) {
			s.left++
		}
	}
	return s
}

// Size returns the object size; BlockSize the block size; Blocks the count.
func (s *Sched) Size() int64      { return s.size }
func (s *Sched) BlockSize() int64 { return s.bsize }
func (s *Sched) Blocks() int      { return len(s.blocks) }

func (s *Sched) blockLen(i int) int64 {
	return min(s.bsize, s.size-int64(i)*s.bsize)
}

func (s *Sched) done(i int) bool { return s.blocks[i].got >= s.blockLen(i) }

// Done reports whether every byte has been received.
func (s *Sched) Done() bool { return s.left == 0 }

// Got returns the bytes held at the start of each block (for a resume file).
func (s *Sched) Got() []int64 {
	out := make([]int64, len(s.blocks))
	for i := range s.blocks {
		out[i] = s.blocks[i].got
	}
	return out
}

// Received returns the bytes held.
func (s *Sched) Received() int64 {
	var n int64
	for i := range s.blocks {
		n += s.blocks[i].got
	}
	return n
}

// Next returns the next range for sub-flow sub: the lowest idle block (not
// done, no request in flight), from the end of its received prefix. When no
// block is idle it returns an end-game duplicate: the lowest unfinished
// block that sub does not hold, with fewer than MaxDup owners, all of which
// faster reports slower than sub (faster(o) true means sub is faster than
// o; nil means always). ok is false when there is nothing to request.
func (s *Sched) Next(sub int, faster func(owner int) bool) (sp Span, ok bool) {
	for ; s.low < len(s.blocks); s.low++ {
		b := &s.blocks[s.low]
		if !s.done(s.low) && len(b.owners) == 0 {
			break
		}
	}
	if s.low < len(s.blocks) {
		return s.take(s.low, sub, false), true
	}
	// End game. Blocks below low can be idle again after a release, so
	// scan everything; the end game is short.
	for i := range s.blocks {
		b := &s.blocks[i]
		if s.done(i) || len(b.owners) >= s.MaxDup || holds(b.owners, sub) {
			continue
		}
		if len(b.owners) == 0 {
			return s.take(i, sub, false), true
		}
		all := true
		for _, o := range b.owners {
			if faster != nil && !faster(o) {
				all = false
				break
			}
		}
		if all {
			return s.take(i, sub, true), true
		}
	}
	return Span{}, false
}

func holds(owners []int, sub int) bool {
	for _, o := range owners {
		if o == sub {
			return true
		}
	}
	return false
}

func (s *Sched) take(i, sub int, dup bool) Span {
	b := &s.blocks[i]
	b.owners = append(b.owners, sub)
	b.issued = true
	start := int64(i) * s.bsize
	return Span{Block: i, Off: start + b.got, End: start + s.blockLen(i), Dup: dup}
}

// Progress records that the request sp received its bytes [sp.Off, upto).
// It returns true when this made the block done.
func (s *Sched) Progress(sp Span, upto int64) bool {
	if sp.Block < 0 || sp.Block >= len(s.blocks) {
		return false
	}
	b := &s.blocks[sp.Block]
	start := int64(sp.Block) * s.bsize
	was := s.done(sp.Block)
	// The bytes extend the prefix only when the request began inside it.
	if sp.Off <= start+b.got && upto-start > b.got {
		b.got = min(upto-start, s.blockLen(sp.Block))
	}
	if !was && s.done(sp.Block) {
		s.left--
		return true
	}
	return false
}

// Release ends sub's request for block i (finished, failed or abandoned):
// an unfinished block without other owners is idle again and is the next
// one handed out if it is the lowest.
func (s *Sched) Release(sub, i int) {
	if i < 0 || i >= len(s.blocks) {
		return
	}
	b := &s.blocks[i]
	for k, o := range b.owners {
		if o == sub {
			b.owners = append(b.owners[:k], b.owners[k+1:]...)
			break
		}
	}
	if len(b.owners) == 0 && !s.done(i) && i < s.low {
		s.low = i
	}
}

// BlockDone reports whether block i has been received whole.
func (s *Sched) BlockDone(i int) bool { return i >= 0 && i < len(s.blocks) && s.done(i) }

// Claim makes sub an owner of block i, as Next would have, for a request
// sent before the scheduler existed: a sub-flow's first range, asked for
// before the object's length was known. It reports false, claiming
// nothing, when the block does not exist, is done or is sub's already.
func (s *Sched) Claim(sub, i int) bool {
	if i < 0 || i >= len(s.blocks) || s.done(i) || holds(s.blocks[i].owners, sub) {
		return false
	}
	b := &s.blocks[i]
	b.owners = append(b.owners, sub)
	b.issued = true
	return true
}
