package ttsbench

// Row is one experiment of the seed's tables: per-link one-way delay,
// jitter and loss (Mininet TCLink + netem apply them per direction on each
// link, so the client-server RTT is 2(D1+D2)).
type Row struct {
	Name           string
	D1, J1, L1     float64 // client - relay link: delay ms, jitter ms, loss %
	D2, J2, L2     float64 // relay - server link
	SeedE2E        float64 // the seed's mean times (s) and sds, CUBIC
	SeedE2ESD      float64
	SeedTTS        float64
	SeedTTSSD      float64
	SeedA12        float64 // P(E2E slower than TTS)
	seedHasFigures bool
}

// SeedRows returns the rows of the seed's two tables (NetSoft 2017 slides,
// 200 trials each, R = 100 Mbit/s). Losses given as 1e-6 % in the seed are
// kept as they are.
func SeedRows() []Row {
	return []Row{
		{Name: "lossy L2=1%", D1: 1, J1: 1, L1: 1e-6, D2: 1, J2: 1, L2: 1, SeedE2E: 6.534, SeedE2ESD: 0.782, SeedTTS: 5.923, SeedTTSSD: 0.073, SeedA12: 0.884, seedHasFigures: true},
		{Name: "lossy L2=1e-2%", D1: 1, J1: 1, L1: 1e-6, D2: 1, J2: 1, L2: 1e-2, SeedE2E: 5.864, SeedE2ESD: 0.261, SeedTTS: 5.672, SeedTTSSD: 0.071, SeedA12: 0.755, seedHasFigures: true},
		{Name: "lossy L2=1e-6%", D1: 1, J1: 1, L1: 1e-6, D2: 1, J2: 1, L2: 1e-6, SeedE2E: 5.924, SeedE2ESD: 0.295, SeedTTS: 5.722, SeedTTSSD: 0.078, SeedA12: 0.748, seedHasFigures: true},
		{Name: "jitter J=1ms", D1: 100, J1: 1, L1: 1e-6, D2: 100, J2: 1, L2: 1e-6, SeedE2E: 11.697, SeedE2ESD: 0.010, SeedTTS: 6.685, SeedTTSSD: 0.116, seedHasFigures: true},
		{Name: "jitter J=10ms", D1: 100, J1: 10, L1: 1e-6, D2: 100, J2: 10, L2: 1e-6, SeedE2E: 11.746, SeedE2ESD: 0.039, SeedTTS: 7.174, SeedTTSSD: 0.139, seedHasFigures: true},
		{Name: "jitter J=100ms", D1: 100, J1: 100, L1: 1e-6, D2: 100, J2: 100, L2: 1e-6, SeedE2E: 35.134, SeedE2ESD: 4.652, SeedTTS: 8.085, SeedTTSSD: 1.148, seedHasFigures: true},
	}
}
