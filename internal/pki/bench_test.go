package pki

import (
	"context"
	"testing"
	"time"
)

func BenchmarkSignCSR(b *testing.B) {
	ca := mustFreshCA(b)
	csr, _ := newCSR(b, "fra")
	for b.Loop() {
		if _, err := ca.SignCSR(csr, "fra", time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJoin is the controller's side of one join: token check (file
// store, consumed) + CSR check + signing.
func BenchmarkJoin(b *testing.B) {
	ca := mustFreshCA(b)
	store := DirTokenStore{Dir: b.TempDir()}
	csr, _ := newCSR(b, "fra")
	ctx := context.Background()
	toks := make([]string, 0, 1024)
	for b.Loop() {
		if len(toks) == 0 {
			b.StopTimer()
			for range cap(toks) {
				t, _, err := ca.CreateToken(ctx, store, TokenOptions{})
				if err != nil {
					b.Fatal(err)
				}
				toks = append(toks, t.String())
			}
			b.StartTimer()
		}
		tok := toks[len(toks)-1]
		toks = toks[:len(toks)-1]
		if _, _, err := ca.Join(ctx, store, tok, "fra", csr, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}
