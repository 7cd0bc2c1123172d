package pathcomp

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

var sizeUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kb":  1000,
	"mb":  1000 * 1000,
	"gb":  1000 * 1000 * 1000,
	"tb":  1000 * 1000 * 1000 * 1000,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

// ParseSize parses a transfer size: a decimal number with an optional
// fraction, optional spaces and an optional case-insensitive unit: B, KB, MB,
// GB, TB (SI: 1 KB = 1000 bytes) or KiB, MiB, GiB, TiB (1 KiB = 1024 bytes).
// "14KB", "450 KB", "1.5MB", "64KiB", "500" are valid. A fractional number
// of bytes is rounded to the nearest byte.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	k := 0
	dots := 0
	for k < len(t) && (t[k] >= '0' && t[k] <= '9' || t[k] == '.') {
		if t[k] == '.' {
			dots++
		}
		k++
	}
	num, unit := t[:k], strings.ToLower(strings.TrimSpace(t[k:]))
	if num == "" || num == "." || dots > 1 {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional unit, like 14KB, 1.5MB or 64KiB", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (want B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", s, t[k:])
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("size %q: bad number %q", s, num)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	// Round half up: floor(r + 1/2).
	r.Add(r, big.NewRat(1, 2))
	v := new(big.Int).Quo(r.Num(), r.Denom())
	if !v.IsInt64() || v.Int64() > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return v.Int64(), nil
}
