package topo

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// maxGMLDepth bounds the nesting of GML lists.
const maxGMLDepth = 64

// maxGMLSize bounds the size of a GML file ReadGML accepts.
const maxGMLSize = 64 << 20

// speedInFibreKmPerMs is 2/3 of the speed of light in vacuum, in km/ms.
const speedInFibreKmPerMs = 299792.458 / 1000 * 2 / 3

// earthRadiusKm is the mean Earth radius used for great-circle distances.
const earthRadiusKm = 6371.0

// ReadGML reads a Topology Zoo GML graph whose nodes carry Latitude and
// Longitude and returns the full mesh over its links: each link's one-way
// delay is the great-circle distance of its ends at 2/3 of the speed of
// light, rounded to whole microseconds, and the RTT of two locations is twice the one-way delay of the
// shortest path between them along the graph's links. Nodes without valid
// coordinates are dropped (with their links), and only the largest connected
// component is kept; the graph is rejected if fewer than 2 nodes remain.
// Locations are named by their label; duplicate or empty labels get the
// node id appended ("Paris (id 7)"). name labels errors ("x.gml:12: ...").
func ReadGML(r io.Reader, name string) (*Matrix, error) {
	m, _, err := readGML(r, name)
	return m, err
}

func readGML(r io.Reader, name string) (*Matrix, []string, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxGMLSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > maxGMLSize {
		return nil, nil, fmt.Errorf("%s: larger than %d bytes", name, maxGMLSize)
	}
	p := &gmlParser{src: data, name: name, line: 1}
	root, err := p.list(0, false)
	if err != nil {
		return nil, nil, err
	}
	var g *gmlValue
	for i := range root {
		if root[i].key == "graph" {
			if root[i].val.kind != gmlList {
				return nil, nil, fmt.Errorf("%s:%d: graph is not a [ ] block", name, root[i].line)
			}
			g = &root[i].val
			break
		}
	}
	if g == nil {
		return nil, nil, fmt.Errorf("%s: no graph [ ] block", name)
	}
	return gmlMesh(g.list, name)
}

type gmlNode struct {
	id       float64
	label    string
	lat, lon float64
	hasCoord bool
	line     int
}

func gmlMesh(items []gmlPair, name string) (*Matrix, []string, error) {
	var nodes []gmlNode
	byID := make(map[float64]int)
	type edge struct {
		s, t float64
		line int
	}
	var edges []edge
	for _, it := range items {
		switch it.key {
		case "node":
			if it.val.kind != gmlList {
				return nil, nil, fmt.Errorf("%s:%d: node is not a [ ] block", name, it.line)
			}
			n := gmlNode{line: it.line, id: math.NaN(), lat: math.NaN(), lon: math.NaN()}
			for _, f := range it.val.list {
				switch strings.ToLower(f.key) {
				case "id":
					if f.val.kind != gmlNumber {
						return nil, nil, fmt.Errorf("%s:%d: node id is not a number", name, f.line)
					}
					n.id = f.val.num
				case "label":
					n.label = f.val.text()
				case "latitude":
					if f.val.kind == gmlNumber {
						n.lat = f.val.num
					}
				case "longitude":
					if f.val.kind == gmlNumber {
						n.lon = f.val.num
					}
				}
			}
			if math.IsNaN(n.id) {
				return nil, nil, fmt.Errorf("%s:%d: node without id", name, it.line)
			}
			if _, dup := byID[n.id]; dup {
				return nil, nil, fmt.Errorf("%s:%d: duplicate node id %v", name, it.line, n.id)
			}
			if len(nodes) >= MaxLocations {
				return nil, nil, fmt.Errorf("%s:%d: more than %d nodes", name, it.line, MaxLocations)
			}
			n.hasCoord = n.lat >= -90 && n.lat <= 90 && n.lon >= -180 && n.lon <= 180
			byID[n.id] = len(nodes)
			nodes = append(nodes, n)
		case "edge":
			if it.val.kind != gmlList {
				return nil, nil, fmt.Errorf("%s:%d: edge is not a [ ] block", name, it.line)
			}
			e := edge{s: math.NaN(), t: math.NaN(), line: it.line}
			for _, f := range it.val.list {
				if f.val.kind != gmlNumber {
					continue
				}
				switch f.key {
				case "source":
					e.s = f.val.num
				case "target":
					e.t = f.val.num
				}
			}
			if math.IsNaN(e.s) || math.IsNaN(e.t) {
				return nil, nil, fmt.Errorf("%s:%d: edge without numeric source and target", name, it.line)
			}
			edges = append(edges, e)
		}
	}
	var warns []string
	var noCoord []string
	pos := make([]int, len(nodes))
	var kept []gmlNode
	labelCount := make(map[string]int)
	for i, n := range nodes {
		pos[i] = -1
		if !n.hasCoord {
			noCoord = append(noCoord, fmt.Sprintf("%q (id %v)", n.label, n.id))
			continue
		}
		pos[i] = len(kept)
		kept = append(kept, n)
		labelCount[n.label]++
	}
	if len(noCoord) > 0 {
		warns = append(warns, fmt.Sprintf("%s: dropped %d of %d nodes without valid Latitude/Longitude: %s", name, len(noCoord), len(nodes), listed(noCoord)))
	}
	if len(kept) < 2 {
		return nil, nil, fmt.Errorf("%s: %d nodes with coordinates; want at least 2", name, len(kept))
	}
	names := make([]string, len(kept))
	used := make(map[string]bool, len(kept))
	for i, n := range kept {
		nm := n.label
		if nm == "" || labelCount[nm] > 1 {
			nm = fmt.Sprintf("%s (id %v)", n.label, n.id)
			if n.label == "" {
				nm = fmt.Sprintf("node %v", n.id)
			}
		}
		for used[nm] {
			nm += "'"
		}
		used[nm] = true
		names[i] = nm
	}
	g := newGraph(names)
	for _, e := range edges {
		si, ok := byID[e.s]
		if !ok {
			return nil, nil, fmt.Errorf("%s:%d: edge source %v is not a node", name, e.line, e.s)
		}
		ti, ok := byID[e.t]
		if !ok {
			return nil, nil, fmt.Errorf("%s:%d: edge target %v is not a node", name, e.line, e.t)
		}
		u, v := pos[si], pos[ti]
		if u < 0 || v < 0 {
			continue
		}
		// Whole microseconds, so that sums along paths are exact for a
		// planner that quantises RTTs to microseconds (pathcomp does): the
		// full mesh is then an exact metric.
		ms := math.Round(GreatCircleKm(kept[u].lat, kept[u].lon, kept[v].lat, kept[v].lon)/speedInFibreKmPerMs*1000) / 1000
		g.link(u, v, ms)
	}
	m, warn := g.fullMesh(name)
	if warn != "" {
		warns = append(warns, warn)
	}
	if len(m.Names) < 2 {
		return nil, nil, fmt.Errorf("%s: largest connected component of located nodes has %d node; want at least 2", name, len(m.Names))
	}
	return m, warns, nil
}

// GreatCircleKm returns the great-circle (haversine) distance in km between
// two points given in degrees, on a sphere of radius 6371 km.
func GreatCircleKm(lat1, lon1, lat2, lon2 float64) float64 {
	rad := math.Pi / 180
	dlat := (lat2 - lat1) * rad
	dlon := (lon2 - lon1) * rad
	a := math.Sin(dlat/2)*math.Sin(dlat/2) + math.Cos(lat1*rad)*math.Cos(lat2*rad)*math.Sin(dlon/2)*math.Sin(dlon/2)
	return 2 * earthRadiusKm * math.Asin(math.Min(1, math.Sqrt(a)))
}

// FibreRTT returns the round-trip time in ms over distance km at 2/3 of the
// speed of light.
func FibreRTT(km float64) float64 { return 2 * km / speedInFibreKmPerMs }

type gmlKind int

const (
	gmlNumber gmlKind = iota
	gmlString
	gmlList
)

type gmlValue struct {
	kind gmlKind
	num  float64
	str  string
	list []gmlPair
}

// text returns a string value, or a number written as text.
func (v gmlValue) text() string {
	switch v.kind {
	case gmlString:
		return v.str
	case gmlNumber:
		return strconv.FormatFloat(v.num, 'g', -1, 64)
	}
	return ""
}

type gmlPair struct {
	key  string
	val  gmlValue
	line int
}

// gmlParser is a recursive-descent parser for GML: a list of "key value"
// pairs, where a value is a number, a "quoted string" or a [ list ]. Lines
// starting with '#' are comments.
type gmlParser struct {
	src  []byte
	pos  int
	line int
	name string
}

func (p *gmlParser) errorf(format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", p.name, p.line, fmt.Sprintf(format, args...))
}

// skip moves past white space and comments.
func (p *gmlParser) skip() {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == '\n':
			p.line++
			p.pos++
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

// list parses pairs until ']' (nested) or the end of input (top level).
func (p *gmlParser) list(depth int, nested bool) ([]gmlPair, error) {
	if depth > maxGMLDepth {
		return nil, p.errorf("lists nested deeper than %d", maxGMLDepth)
	}
	var out []gmlPair
	for {
		p.skip()
		if p.pos >= len(p.src) {
			if nested {
				return nil, p.errorf("unexpected end of file; want ']'")
			}
			return out, nil
		}
		if p.src[p.pos] == ']' {
			if !nested {
				return nil, p.errorf("unexpected ']'")
			}
			p.pos++
			return out, nil
		}
		line := p.line
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		p.skip()
		if p.pos >= len(p.src) {
			return nil, p.errorf("key %q without a value", key)
		}
		var v gmlValue
		switch c := p.src[p.pos]; {
		case c == '[':
			p.pos++
			l, err := p.list(depth+1, true)
			if err != nil {
				return nil, err
			}
			v = gmlValue{kind: gmlList, list: l}
		case c == '"':
			s, err := p.str()
			if err != nil {
				return nil, err
			}
			v = gmlValue{kind: gmlString, str: s}
		default:
			f, err := p.number()
			if err != nil {
				return nil, fmt.Errorf("%w (value of %q)", err, key)
			}
			v = gmlValue{kind: gmlNumber, num: f}
		}
		out = append(out, gmlPair{key: key, val: v, line: line})
	}
}

func isKeyByte(c byte, first bool) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || !first && c >= '0' && c <= '9'
}

func (p *gmlParser) key() (string, error) {
	start := p.pos
	for p.pos < len(p.src) && isKeyByte(p.src[p.pos], p.pos == start) {
		p.pos++
	}
	if p.pos == start {
		return "", p.errorf("unexpected %q; want a key", p.src[p.pos])
	}
	return string(p.src[start:p.pos]), nil
}

func (p *gmlParser) str() (string, error) {
	startLine := p.line
	p.pos++ // opening quote
	end := bytes.IndexByte(p.src[p.pos:], '"')
	if end < 0 {
		p.line = startLine
		return "", p.errorf("unterminated string")
	}
	s := p.src[p.pos : p.pos+end]
	p.line += bytes.Count(s, []byte{'\n'})
	p.pos += end + 1
	return html.UnescapeString(string(s)), nil
}

func (p *gmlParser) number() (float64, error) {
	start := p.pos
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']' || c == '"' || c == '#' {
			break
		}
		p.pos++
	}
	tok := string(p.src[start:p.pos])
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || tok == "" {
		return 0, p.errorf("%q is not a number", tok)
	}
	return f, nil
}
