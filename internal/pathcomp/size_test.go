package pathcomp

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "14KB", want: 14000},
		{in: "450 KB", want: 450000},
		{in: "14935KB", want: 14935000},
		{in: "1.5MB", want: 1500000},
		{in: "64KiB", want: 65536},
		{in: "1MiB", want: 1 << 20},
		{in: "500", want: 500},
		{in: "500B", want: 500},
		{in: "2gb", want: 2e9},
		{in: "1TiB", want: 1 << 40},
		{in: " 7 kb ", want: 7000},
		{in: "0", want: 0},
		{in: "0.4", want: 0},
		{in: "0.5", want: 1},
		{in: "1.0005KB", want: 1001},
		{in: ".5KB", want: 500},
		{in: "", wantErr: "want a number"},
		{in: "KB", wantErr: "want a number"},
		{in: "-1KB", wantErr: "want a number"},
		{in: "1..2KB", wantErr: "want a number"},
		{in: "12XB", wantErr: "unknown unit"},
		{in: "1e3", wantErr: "unknown unit"},
		{in: "inf", wantErr: "want a number"},
		{in: "NaN", wantErr: "want a number"},
		{in: "99999999999TB", wantErr: "too large"},
		{in: "1 2KB", wantErr: "unknown unit"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSize(%q) = %d, %v; want error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestRoundsOfPaperSizes(t *testing.T) {
	for _, tt := range []struct {
		size string
		want int
	}{{"14KB", 1}, {"14.6KB", 1}, {"14.7KB", 2}, {"450KB", 5}, {"14935KB", 10}} {
		s, err := ParseSize(tt.size)
		if err != nil {
			t.Fatal(err)
		}
		if got := (Model{}).Rounds(s); got != tt.want {
			t.Errorf("Rounds(%s) = %d; want %d", tt.size, got, tt.want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"14KB", "450 KB", "1.5MB", "64KiB", "500", "", ".", "1..", "9999999999999999999", "1e9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "size ") {
				t.Fatalf("ParseSize(%q) error %q lacks the size prefix", s, err)
			}
			return
		}
		if v < 0 {
			t.Fatalf("ParseSize(%q) = %d < 0", s, v)
		}
	})
}
