package topo

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

var inf = math.Inf(1)

// rtt returns the RTT between two named locations of m.
func rtt(tb testing.TB, m *Matrix, a, b string) float64 {
	tb.Helper()
	i, j := m.Index(a), m.Index(b)
	if i < 0 || j < 0 {
		tb.Fatalf("locations %q/%q not in %v", a, b, m.Names)
	}
	return m.RTT[i][j]
}

func near(a, b float64) bool {
	if math.IsInf(a, 1) || math.IsInf(b, 1) {
		return a == b
	}
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b))
}

func checkPairs(tb testing.TB, m *Matrix, want map[[2]string]float64) {
	tb.Helper()
	if err := m.Validate(); err != nil {
		tb.Fatalf("Validate: %v", err)
	}
	for i := range m.RTT {
		for j := range m.RTT {
			if m.RTT[i][j] != m.RTT[j][i] {
				tb.Errorf("not symmetric: %s/%s %v vs %v", m.Names[i], m.Names[j], m.RTT[i][j], m.RTT[j][i])
			}
		}
	}
	for p, w := range want {
		if got := rtt(tb, m, p[0], p[1]); !near(got, w) {
			tb.Errorf("RTT(%s, %s) = %v; want %v", p[0], p[1], got, w)
		}
	}
}

func TestReadCSV(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		names    []string
		want     map[[2]string]float64
		warnings []string // substrings, one per expected warning
	}{
		{
			name:  "labelled",
			in:    "x,A,B\nA,0,5\nB,5,0\n",
			names: []string{"A", "B"},
			want:  map[[2]string]float64{{"A", "B"}: 5},
		},
		{
			name:  "labelled empty corner, rows reordered",
			in:    ",A,B,C\nC,1,2,0\nA,0,3,1\nB,3,0,2\n",
			names: []string{"A", "B", "C"},
			want:  map[[2]string]float64{{"A", "B"}: 3, {"A", "C"}: 1, {"B", "C"}: 2},
		},
		{
			name:  "bare",
			in:    "A,B,C\n0,1,2\n1,0,3\n2,3,0\n",
			names: []string{"A", "B", "C"},
			want:  map[[2]string]float64{{"A", "B"}: 1, {"A", "C"}: 2, {"B", "C"}: 3},
		},
		{
			name:     "asymmetric mean and warning",
			in:       "A,B\n0,10\n12,0\n",
			names:    []string{"A", "B"},
			want:     map[[2]string]float64{{"A", "B"}: 11},
			warnings: []string{"1 asymmetric pairs", "A<->B 10/12 ms"},
		},
		{
			name:     "small asymmetry not named",
			in:       "A,B\n0,10\n10.5,0\n",
			names:    []string{"A", "B"},
			want:     map[[2]string]float64{{"A", "B"}: 10.25},
			warnings: []string{"1 asymmetric pairs"},
		},
		{
			name:  "one direction measured",
			in:    "A,B,C\n0,,NaN\n7,0,-\n,inf,0\n",
			names: []string{"A", "B", "C"},
			want:  map[[2]string]float64{{"A", "B"}: 7, {"A", "C"}: inf, {"B", "C"}: inf},
		},
		{
			name:     "diagonal ignored",
			in:       "A,B\n4,1\n1,\n",
			names:    []string{"A", "B"},
			want:     map[[2]string]float64{{"A", "A"}: 0, {"B", "B"}: 0, {"A", "B"}: 1},
			warnings: []string{"1 non-zero diagonal entries"},
		},
		{
			name:  "comments BOM spaces CRLF",
			in:    "\ufeff# c\r\n name , A , B \r\nA, 0 , 2.5\r\n# mid\r\nB, 2.5 , 0\r\n",
			names: []string{"A", "B"},
			want:  map[[2]string]float64{{"A", "B"}: 2.5},
		},
		{
			// C has a row but no column, B a column but no row.
			name:     "rows and columns differ",
			in:       "x,A,B\nA,0,4\nC,6,8\n",
			names:    []string{"A", "B", "C"},
			want:     map[[2]string]float64{{"A", "B"}: 4, {"A", "C"}: 6, {"B", "C"}: 8},
			warnings: []string{"measured in one direction only: C (row, no column), B (column, no row)"},
		},
		{
			name:  "single location",
			in:    "A\n0\n",
			names: []string{"A"},
		},
		{
			name:  "quoted names with commas",
			in:    "\"\",\"Paris, FR\",\"Oslo, NO\"\n\"Paris, FR\",0,30\n\"Oslo, NO\",30,0\n",
			names: []string{"Paris, FR", "Oslo, NO"},
			want:  map[[2]string]float64{{"Paris, FR", "Oslo, NO"}: 30},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, warns, err := ReadCSV(strings.NewReader(tt.in), "t.csv")
			if err != nil {
				t.Fatalf("ReadCSV: %v", err)
			}
			if strings.Join(m.Names, "|") != strings.Join(tt.names, "|") {
				t.Errorf("names = %q; want %q", m.Names, tt.names)
			}
			checkPairs(t, m, tt.want)
			if len(warns) != len(tt.warnings) {
				t.Fatalf("warnings = %q; want %d matching %q", warns, len(tt.warnings), tt.warnings)
			}
			for k, w := range tt.warnings {
				if !strings.Contains(warns[k], w) || !strings.HasPrefix(warns[k], "t.csv") {
					t.Errorf("warning %d = %q; want it to start with t.csv and contain %q", k, warns[k], w)
				}
			}
		})
	}
}

func TestReadCSVErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", "t.csv: empty file"},
		{"only comments", "# nothing\n", "t.csv: empty file"},
		{"not square", "x,A,B\nA,0,1\n", "t.csv: 3 cells in the header but 1 data rows"},
		{"too many rows", "A,B\n0,1\n1,0\n1,1\n", "2 cells in the header but 3 data rows"},
		{"short row", "x,A,B\nA,0,1\nB,1\n", "t.csv:3: row has 2 cells; want 3"},
		{"bad number", "x,A,B\nA,0,1\nB,abc,0\n", `t.csv:3: column 2: RTT "abc" is not a number`},
		{"negative", "x,A,B,C\nA,0,1,1\nB,1,0,1\nC,1,-4,0\n", `t.csv:4: column 3: RTT "-4" is negative`},
		{"huge", "A,B\n0,1e999\n1,0\n", `t.csv:2: column 2: RTT "1e999" is not a number`},
		{"duplicate name", "x,A,A\nA,0,1\nA,1,0\n", `t.csv:1: column 3: duplicate location "A"`},
		{"empty name", "x,A,\nA,0,1\nB,1,0\n", "t.csv:1: column 3: empty location name"},
		{"empty row name", "x,A,B\nA,0,1\n ,1,0\n", "t.csv:3: column 1: empty row name"},
		{"second row", "x,A,B\nA,0,1\nA,1,0\n", `t.csv:3: column 1: second row for "A"`},
		{"bad quote", "x,A,B\nA,0,\"1\nB,1,0\n", "t.csv:"},
		{"no locations", "x\n", "t.csv: no locations"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ReadCSV(strings.NewReader(tt.in), "t.csv")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadCSV error = %v; want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestReadRocketfuel(t *testing.T) {
	routers := "P1 P2 1\nP2 P1 1\nP1 L3 4\nL3 P1 4\nP2 B4 7\nB4 P2 7\nL3 B4 20\nB4 L3 20\nO5 O6 2\n"
	tests := []struct {
		name   string
		in     string
		cities bool
		names  []string
		want   map[[2]string]float64
		warn   string
	}{
		{
			name:  "routers shortest path and largest component",
			in:    routers,
			names: []string{"P1", "P2", "L3", "B4"},
			// L3-B4: 4+1+7 = 12 beats the 20 ms link.
			want: map[[2]string]float64{{"L3", "B4"}: 24, {"L3", "P2"}: 10, {"P1", "B4"}: 16, {"P1", "P2"}: 2},
			warn: "kept the largest connected component (4 of 6 nodes); dropped O5, O6",
		},
		{
			name:   "cities",
			in:     "Paris,+France1 Paris,+France2 1\nParis,+France1 London,+UK3 4\nParis,+France2 Berlin,+Germany4 7\nLondon,+UK3 Berlin,+Germany4 20\nOslo,+Norway5 Oslo,+Norway6 2\n",
			cities: true,
			names:  []string{"Paris, France", "London, UK", "Berlin, Germany"},
			want:   map[[2]string]float64{{"Paris, France", "London, UK"}: 8, {"Paris, France", "Berlin, Germany"}: 14, {"London, UK", "Berlin, Germany"}: 22},
			warn:   `dropped Oslo, Norway`,
		},
		{
			name:  "asymmetric link keeps the smaller latency, comments, fractions",
			in:    "# map\nA B 3\n\nB A 2.5\nB C 1\n",
			names: []string{"A", "B", "C"},
			want:  map[[2]string]float64{{"A", "B"}: 5, {"A", "C"}: 7, {"B", "C"}: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, warns, err := readRocketfuel(strings.NewReader(tt.in), "l.intra", RocketfuelOptions{Cities: tt.cities})
			if err != nil {
				t.Fatalf("ReadRocketfuel: %v", err)
			}
			if strings.Join(m.Names, "|") != strings.Join(tt.names, "|") {
				t.Errorf("names = %q; want %q", m.Names, tt.names)
			}
			checkPairs(t, m, tt.want)
			if tt.warn == "" && len(warns) > 0 || tt.warn != "" && (len(warns) != 1 || !strings.Contains(warns[0], tt.warn)) {
				t.Errorf("warnings = %q; want %q", warns, tt.warn)
			}
		})
	}
}

func TestReadRocketfuelErrors(t *testing.T) {
	tests := []struct {
		name, in string
		cities   bool
		want     string
	}{
		{"empty", "", false, "l.intra: no links"},
		{"fields", "A B 1\nA B\n", false, `l.intra:2: 2 fields; want "<router> <router> <latency ms>"`},
		{"not a number", "A B x\n", false, `l.intra:1: field 3: latency "x" is not a number`},
		{"negative", "\nA B -1\n", false, `l.intra:2: field 3: latency "-1" is negative`},
		{"nan", "A B NaN\n", false, "not a number"},
		{"self loop", "A A 1\n", false, `l.intra:1: link from "A" to itself`},
		{"one city", "X1 X2 1\n", true, "fewer than 2 locations"},
		{"long line", strings.Repeat("a", 2<<20), false, "l.intra:1: line longer than 1 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadRocketfuel(strings.NewReader(tt.in), "l.intra", RocketfuelOptions{Cities: tt.cities})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadRocketfuel error = %v; want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestGreatCircle(t *testing.T) {
	tests := []struct {
		name                   string
		lat1, lon1, lat2, lon2 float64
		km, tol                float64
	}{
		{"London-New York", 51.5074, -0.1278, 40.7128, -74.0060, 5570, 5},
		{"same point", 10, 20, 10, 20, 0, 1e-9},
		{"antipodes", 0, 0, 0, 180, math.Pi * 6371, 1e-6},
		{"pole to equator", 90, 0, 0, 45, math.Pi / 2 * 6371, 1e-6},
		{"across the date line", 0, 179.5, 0, -179.5, 111.19, 0.01},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := GreatCircleKm(tt.lat1, tt.lon1, tt.lat2, tt.lon2); math.Abs(got-tt.km) > tt.tol {
				t.Errorf("GreatCircleKm = %v km; want %v +- %v", got, tt.km, tt.tol)
			}
		})
	}
	// 2/3 c is 199.86 km/ms: 1000 km costs 10.007 ms of RTT.
	if got := FibreRTT(1000); math.Abs(got-10.0069) > 1e-3 {
		t.Errorf("FibreRTT(1000) = %v ms; want 10.007", got)
	}
}

func TestReadGML(t *testing.T) {
	// One-way link delays are rounded to whole microseconds.
	oneWay := func(km float64) float64 { return math.Round(FibreRTT(km)/2*1000) / 1000 }
	ln := oneWay(GreatCircleKm(51.5074, -0.1278, 40.7128, -74.0060))
	nb := oneWay(GreatCircleKm(40.7128, -74.0060, 42.3601, -71.0589))
	m, warns, err := Load("testdata/small.gml", "")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(m.Names, "|"); got != "London|New York|Boston" {
		t.Errorf("names = %q", got)
	}
	checkPairs(t, m, map[[2]string]float64{
		{"London", "New York"}: 2 * ln,
		{"New York", "Boston"}: 2 * nb,
		{"London", "Boston"}:   2 * (ln + nb),
	})
	if len(warns) != 1 || !strings.Contains(warns[0], `dropped 1 of 4 nodes without valid Latitude/Longitude: "Nowhere" (id 2)`) {
		t.Errorf("warnings = %q", warns)
	}
	if got := rtt(t, m, "London", "New York"); math.Abs(got-55.74) > 0.1 {
		t.Errorf("London-New York RTT = %v; want about 55.7 ms", got)
	}
}

func TestReadGMLNames(t *testing.T) {
	in := `graph [ node [ id 1 label "A" Latitude 0 Longitude 0 ] node [ id 2 label "A" Latitude 0 Longitude 1 ]
	node [ id 3 Latitude 1 Longitude 1 ] node [ id 4 label 42 Latitude 1 Longitude 0 ]
	node [ id 5 label "far" Latitude 9 Longitude 9 ] node [ id 6 label "farther" Latitude 19 Longitude 9 ]
	edge [ source 1 target 2 ] edge [ source 2 target 3 ] edge [ source 3 target 4 ] edge [ source 5 target 6 ] ]`
	m, warns, err := readGML(strings.NewReader(in), "n.gml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(m.Names, "|"); got != "A (id 1)|A (id 2)|node 3|42" {
		t.Errorf("names = %q", got)
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "kept the largest connected component (4 of 6 nodes); dropped far, farther") {
		t.Errorf("warnings = %q", warns)
	}
}

func TestReadGMLErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", "g.gml: no graph [ ] block"},
		{"graph not a list", "graph 1", "g.gml:1: graph is not a [ ] block"},
		{"unterminated list", "graph [\n node [ id 1 ]\n", "g.gml:3: unexpected end of file; want ']'"},
		{"stray bracket", "graph [ ] ]", "g.gml:1: unexpected ']'"},
		{"unterminated string", "graph [\n label \"abc\n", "g.gml:2: unterminated string"},
		{"bad value", "graph [\n\n directed yes ]", `g.gml:3: "yes" is not a number (value of "directed")`},
		{"key without value", "graph [ node", `key "node" without a value`},
		{"bad key", "graph [ 12 3 ]", "want a key"},
		{"node without id", "graph [ node [ label \"a\" ] ]", "g.gml:1: node without id"},
		{"duplicate id", "graph [ node [ id 1 ]\n node [ id 1 ] ]", "g.gml:2: duplicate node id 1"},
		{"string id", "graph [ node [ id \"a\" ] ]", "node id is not a number"},
		{"edge to nowhere", "graph [ node [ id 1 Latitude 0 Longitude 0 ] node [ id 2 Latitude 1 Longitude 1 ]\nedge [ source 1 target 9 ] ]", "g.gml:2: edge target 9 is not a node"},
		{"edge without target", "graph [ edge [ source 1 ] ]", "edge without numeric source and target"},
		{"too few located", "graph [ node [ id 1 Latitude 0 Longitude 0 ] node [ id 2 ] ]", "g.gml: 1 nodes with coordinates; want at least 2"},
		{"bad coordinates", "graph [ node [ id 1 Latitude 91 Longitude 0 ] node [ id 2 Latitude 0 Longitude 0 ] ]", "want at least 2"},
		{"deep nesting", "graph " + strings.Repeat("[ a ", 100) + strings.Repeat("]", 100), "nested deeper than 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadGML(strings.NewReader(tt.in), "g.gml")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadGML error = %v; want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		path, format string
		n            int
		nwarn        int
	}{
		{"testdata/small.csv", "", 3, 2},
		{"testdata/small.csv", "CSV", 3, 2},
		{"testdata/small.intra", "", 4, 1},
		{"testdata/small.intra", "rocketfuel-cities", 3, 1},
		{"testdata/small.gml", "zoo", 3, 1},
	}
	for _, tt := range tests {
		t.Run(tt.path+"/"+tt.format, func(t *testing.T) {
			m, warns, err := Load(tt.path, tt.format)
			if err != nil {
				t.Fatal(err)
			}
			if m.Len() != tt.n || len(warns) != tt.nwarn {
				t.Errorf("Load = %d locations, warnings %q; want %d locations, %d warnings", m.Len(), warns, tt.n, tt.nwarn)
			}
			for _, w := range warns {
				if !strings.HasPrefix(w, tt.path) {
					t.Errorf("warning %q does not name %s", w, tt.path)
				}
			}
		})
	}
	for _, tt := range []struct{ path, format, want string }{
		{"testdata/small.txt", "", "cannot tell the format"},
		{"testdata/small.csv", "xml", `unknown network input format "xml"`},
		{"testdata/missing.csv", "", "open network input"},
		{"testdata/small.intra", "csv", "testdata/small.intra: "},
	} {
		if _, _, err := Load(tt.path, tt.format); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%q, %q) error = %v; want %q", tt.path, tt.format, err, tt.want)
		}
	}
}

func TestWonderProxy(t *testing.T) {
	m := WonderProxy()
	if m.Len() != 246 {
		t.Fatalf("WonderProxy has %d locations; want 246", m.Len())
	}
	checkPairs(t, m, map[[2]string]float64{
		{"Dublin", "London"}:       (11.764 + 11.601) / 2, // both directions measured
		{"NewYork", "London"}:      (71.127 + 70.960) / 2,
		{"SanJose", "Chisinau"}:    inf, // measured in neither direction
		{"Moscow", "Montevideo"}:   rtt(t, m, "Montevideo", "Moscow"),
		{"Dublin", "SanFrancisco"}: (149.204 + 149.222) / 2,
	})
}

func TestDefault(t *testing.T) {
	m := Default()
	if m.Len() != 30 {
		t.Fatalf("Default has %d locations; want 30", m.Len())
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"Dublin", "London", "NewYork", "Washington", "Chicago", "Denver", "SanFrancisco", "LosAngeles", "Tokyo", "Sydney", "SaoPaulo", "Johannesburg"} {
		if m.Index(c) < 0 {
			t.Errorf("Default lacks %s", c)
		}
	}
	for i := range m.RTT {
		for j := range m.RTT {
			if i != j && (math.IsInf(m.RTT[i][j], 1) || m.RTT[i][j] <= 0) {
				t.Errorf("Default RTT %s-%s = %v; want measured", m.Names[i], m.Names[j], m.RTT[i][j])
			}
		}
	}
}

func TestRocketfuelEmbedded(t *testing.T) {
	// Sizes from the shared data set's README (largest connected component,
	// cities).
	want := map[string][2]int{
		"1221": {104, 57}, "1239": {315, 44}, "1755": {87, 23},
		"3257": {161, 50}, "3967": {79, 22}, "6461": {138, 22},
	}
	for _, as := range RocketfuelASes() {
		for k, cities := range []bool{false, true} {
			m, err := Rocketfuel("AS"+as, cities)
			if err != nil {
				t.Fatal(err)
			}
			if m.Len() != want[as][k] {
				t.Errorf("AS%s cities=%v: %d locations; want %d", as, cities, m.Len(), want[as][k])
			}
			if err := m.Validate(); err != nil {
				t.Errorf("AS%s: %v", as, err)
			}
			for i := range m.RTT {
				for j := range m.RTT {
					if math.IsInf(m.RTT[i][j], 1) {
						t.Fatalf("AS%s: %s-%s disconnected", as, m.Names[i], m.Names[j])
					}
				}
			}
		}
	}
	if _, err := Rocketfuel("7018", false); err == nil {
		t.Error("Rocketfuel(7018) succeeded; want an error")
	}
}

// TestRocketfuelFloydWarshall checks the Dijkstra full mesh against an
// independent Floyd-Warshall over the raw links of AS1755.
func TestRocketfuelFloydWarshall(t *testing.T) {
	b, err := data.ReadFile("data/rocketfuel/AS1755/latencies.intra")
	if err != nil {
		t.Fatal(err)
	}
	m, err := ReadRocketfuel(strings.NewReader(string(b)), "AS1755", RocketfuelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := m.Len()
	d := make([][]float64, n)
	for i := range d {
		d[i] = make([]float64, n)
		for j := range d[i] {
			if i != j {
				d[i][j] = inf
			}
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var u, v string
		var ms float64
		f := strings.Fields(line)
		u, v = f[0], f[1]
		if _, err := fmt.Sscan(f[2], &ms); err != nil {
			t.Fatal(err)
		}
		i, j := m.Index(u), m.Index(v)
		d[i][j] = math.Min(d[i][j], ms)
	}
	for k := 0; k < n; k++ {
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				d[i][j] = math.Min(d[i][j], d[i][k]+d[k][j])
			}
		}
	}
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if !near(m.RTT[i][j], 2*d[i][j]) {
				t.Fatalf("RTT %s-%s = %v; Floyd-Warshall says %v", m.Names[i], m.Names[j], m.RTT[i][j], 2*d[i][j])
			}
		}
	}
}

func TestEvalGraphs(t *testing.T) {
	gs, err := EvalGraphs(7, 115)
	if err != nil {
		t.Fatal(err)
	}
	// 6 Rocketfuel city maps, 3 router maps (AS1221, AS1755, AS3967) and 67
	// geolocated Zoo graphs.
	if len(gs) != 76 {
		t.Errorf("EvalGraphs(7, 115) = %d graphs; want 76", len(gs))
	}
	zoo, err := ZooGraphs(7, 115)
	if err != nil {
		t.Fatal(err)
	}
	if len(zoo) != 67 {
		t.Errorf("ZooGraphs(7, 115) = %d graphs; want 67", len(zoo))
	}
	for _, g := range gs {
		if n := g.Matrix.Len(); n < 7 || n > 115 {
			t.Errorf("%s has %d locations", g.Name, n)
		}
		if err := g.Matrix.Validate(); err != nil {
			t.Errorf("%s: %v", g.Name, err)
		}
	}
	small, err := ZooGraphs(7, 12)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range small {
		if m.Len() > 12 {
			t.Errorf("ZooGraphs(7, 12) returned %d locations", m.Len())
		}
	}
	if len(small) == 0 || len(small) >= len(zoo) {
		t.Errorf("ZooGraphs(7, 12) = %d graphs; want a proper subset of %d", len(small), len(zoo))
	}
}

func TestFind(t *testing.T) {
	m := &Matrix{Names: []string{"SanFrancisco", "San Jose, CA", "sanjose,ca", "London"}}
	tests := []struct {
		name string
		want int
	}{
		{"SanFrancisco", 0}, {"San Francisco", 0}, {"san-francisco", 0}, {"LONDON", 3},
		{"sanjose,ca", 2},   // exact match wins
		{"San Jose CA", -1}, // ambiguous loose match
		{"Paris", -1}, {"", -1}, {"  ", -1},
	}
	for _, tt := range tests {
		if got := m.Find(tt.name); got != tt.want {
			t.Errorf("Find(%q) = %d; want %d", tt.name, got, tt.want)
		}
	}
}

func TestReadGMLKeyCase(t *testing.T) {
	in := "graph [ node [ ID 1 Label \"a\" latitude 10 LONGITUDE 20 ] node [ id 2 label \"b\" Latitude 10 Longitude 21 ] edge [ source 1 target 2 ] ]"
	m, err := ReadGML(strings.NewReader(in), "k.gml")
	if err != nil {
		t.Fatal(err)
	}
	want := 2 * math.Round(FibreRTT(GreatCircleKm(10, 20, 10, 21))/2*1000) / 1000
	checkPairs(t, m, map[[2]string]float64{{"a", "b"}: want})
}
