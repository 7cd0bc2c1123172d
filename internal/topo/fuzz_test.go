package topo

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"
)

// checkFuzzResult asserts the invariants every reader guarantees: either a
// valid symmetric matrix or an error naming the input.
func checkFuzzResult(t *testing.T, m *Matrix, err error, name string) {
	t.Helper()
	if err != nil {
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("error %q does not name the input %s", err, name)
		}
		return
	}
	if m.Len() == 0 {
		t.Fatal("no error and no locations")
	}
	if verr := m.Validate(); verr != nil {
		t.Fatalf("invalid matrix without error: %v", verr)
	}
	for i := range m.RTT {
		for j := range m.RTT {
			a, b := m.RTT[i][j], m.RTT[j][i]
			if a != b && !(math.IsInf(a, 1) && math.IsInf(b, 1)) {
				t.Fatalf("asymmetric %v/%v", a, b)
			}
		}
	}
}

func addFile(f *testing.F, path string) {
	f.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
}

func FuzzReadCSV(f *testing.F) {
	addFile(f, "testdata/small.csv")
	for _, s := range []string{"A,B\n0,1\n1,0\n", ",A\nA,0\n", "x,A,B\nA,0,\"1\nB,1,0\n", "\ufeffA\n0\n", "a,b\n-1,nan\n1e999,0\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, _, err := ReadCSV(bytes.NewReader(in), "f.csv")
		checkFuzzResult(t, m, err, "f.csv")
	})
}

func FuzzReadRocketfuel(f *testing.F) {
	addFile(f, "testdata/small.intra")
	f.Add([]byte("A1 B2 1\nB2 C3 2.5\n"))
	f.Add([]byte("A A 1\n"))
	f.Add([]byte("X1 X2 1\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, cities := range []bool{false, true} {
			m, err := ReadRocketfuel(bytes.NewReader(in), "f.intra", RocketfuelOptions{Cities: cities})
			checkFuzzResult(t, m, err, "f.intra")
		}
	})
}

func FuzzReadGML(f *testing.F) {
	addFile(f, "testdata/small.gml")
	addFile(f, "data/zoo/Abilene.gml")
	f.Add([]byte("graph [ node [ id 1 Latitude 0 Longitude 0 ] node [ id 2 Latitude 1 Longitude 1 ] edge [ source 1 target 2 ] ]"))
	f.Add([]byte("graph [ label \"unterminated ]"))
	f.Add([]byte("graph [ [ ] ]"))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ReadGML(bytes.NewReader(in), "f.gml")
		checkFuzzResult(t, m, err, "f.gml")
	})
}
