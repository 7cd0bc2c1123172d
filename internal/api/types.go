package api

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/mosto-net/mosto/internal/pathcomp"
)

// URL paths of the API.
const (
	PathJoin    = "/v1/join"
	PathFEPs    = "/v1/feps"    // POST, GET; DELETE and GET .../{id}/targets below it
	PathReports = "/v1/reports" // POST
	PathTables  = "/v1/tables/" // GET /v1/tables/{lop}?since=V&wait=30s
	PathMatrix  = "/v1/matrix"
	// PathDestinations: POST, GET; DELETE .../{id}.
	PathDestinations = "/v1/destinations"
	PathHealth       = "/healthz"
	PathMetrics      = "/metrics"
	PathOpenAPI      = "/v1/openapi.yaml"
)

// Limits applied to requests.
const (
	MaxIDLen        = 63
	MaxBodyBytes    = 4 << 20 // request bodies larger than this are refused (413)
	MaxSamples      = 10000   // samples in one report (FEP and destination samples each)
	MaxDestinations = 10000   // registered destinations
	MaxRTTMS        = 60000   // an RTT above one minute is a measurement bug
	MaxWait         = 120 * time.Second
	MaxClockSkew    = time.Minute // a sample time further in the future is refused
	VersionHeader   = "X-Mosto-Version"
	LeaderHeader    = "X-Mosto-Leader"
	DefaultWaitPoll = 30 * time.Second // what Client.WatchTable asks for
)

// FEP is a front-end proxy (a PoP running `mosto proxy`).
type FEP struct {
	ID        string  `json:"id"`                 // [A-Za-z0-9][A-Za-z0-9._-]*, at most 63 bytes
	HopAddr   string  `json:"hop_addr"`           // host:port of its relay (hop) listener
	ProbeAddr string  `json:"probe_addr"`         // host:port of its measurement endpoint
	Location  string  `json:"location,omitempty"` // free text, e.g. "Frankfurt, DE"
	Lat       float64 `json:"lat"`                // degrees, -90..90
	Lon       float64 `json:"lon"`                // degrees, -180..180
	// CertSerial is the serial number (hex) of the one client certificate
	// that may act for this FEP, set by the controller at the join (and
	// when the FEP registers itself); a FEP's own value is ignored.
	CertSerial string `json:"cert_serial,omitempty"`
}

// Validate reports the first problem of f, or nil.
func (f FEP) Validate() error {
	if err := ValidateID(f.ID); err != nil {
		return fmt.Errorf("fep id: %w", err)
	}
	if err := validateHostPort(f.HopAddr); err != nil {
		return fmt.Errorf("fep %s hop_addr: %w", f.ID, err)
	}
	if err := validateHostPort(f.ProbeAddr); err != nil {
		return fmt.Errorf("fep %s probe_addr: %w", f.ID, err)
	}
	if len(f.CertSerial) > 64 {
		return fmt.Errorf("fep %s cert_serial: longer than 64 bytes", f.ID)
	}
	if len(f.Location) > 256 {
		return fmt.Errorf("fep %s location: longer than 256 bytes", f.ID)
	}
	if math.IsNaN(f.Lat) || f.Lat < -90 || f.Lat > 90 {
		return fmt.Errorf("fep %s lat %v: want -90..90", f.ID, f.Lat)
	}
	if math.IsNaN(f.Lon) || f.Lon < -180 || f.Lon > 180 {
		return fmt.Errorf("fep %s lon %v: want -180..180", f.ID, f.Lon)
	}
	return nil
}

// ValidateID checks a FEP (or LoP) identifier.
func ValidateID(id string) error {
	if id == "" {
		return errors.New("empty")
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%q longer than %d bytes", id[:16]+"...", MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			i > 0 && (c == '.' || c == '_' || c == '-')
		if !ok {
			return fmt.Errorf("%q: want letters, digits, '.', '_', '-' (not first)", id)
		}
	}
	return nil
}

func validateHostPort(s string) error {
	if s == "" {
		return errors.New("empty; want host:port")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q: %w", s, err)
	}
	if host == "" {
		return fmt.Errorf("%q: empty host", s)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port must be 1..65535", s)
	}
	return nil
}

// JoinRequest is the body of POST /v1/join: a proxy presents a join token
// (from `mosto token create`), describes itself and asks for a certificate.
type JoinRequest struct {
	Token  string `json:"token"`
	FEP    FEP    `json:"fep"`
	CSRPEM string `json:"csr_pem"` // PEM "CERTIFICATE REQUEST"
}

// Validate checks the shape of r (not the token or the CSR signature, which the
// Joiner checks).
func (r JoinRequest) Validate() error {
	if r.Token == "" {
		return errors.New("token: empty")
	}
	if len(r.Token) > 4096 {
		return errors.New("token: longer than 4096 bytes")
	}
	if err := r.FEP.Validate(); err != nil {
		return err
	}
	if r.CSRPEM == "" {
		return errors.New("csr_pem: empty")
	}
	return nil
}

// JoinResponse carries the signed client certificate of the FEP and the CA
// certificate it must trust for the controller.
type JoinResponse struct {
	CertPEM string `json:"cert_pem"`
	CAPEM   string `json:"ca_pem"`
}

// FEPList is the body of GET /v1/feps.
type FEPList struct {
	FEPs []FEP `json:"feps"`
}

// Target is a peer that a FEP must measure.
type Target struct {
	ID        string `json:"id"`
	ProbeAddr string `json:"probe_addr"`
	Reason    string `json:"reason"` // "near" (one of the k nearest) or "far" (a random long pair)
}

// Targets is the body of GET /v1/feps/{id}/targets.
type Targets struct {
	FEP     string   `json:"fep"`
	Targets []Target `json:"targets"`
	// Destinations are the destinations this FEP must measure (TCP
	// connect time to their probe address), so the controller can pick
	// the EgP of each by measured RTT.
	Destinations []DestTarget `json:"destinations,omitempty"`
}

// DestTarget is a destination a FEP must measure.
type DestTarget struct {
	ID        string `json:"id"`
	ProbeAddr string `json:"probe_addr"` // host:port a TCP connect is timed to
}

// Destination is a destination prefix (a service's origins) and where it
// is. With a probe address, the FEPs nearest to it measure their RTT to it
// and its EgP is the FEP with the lowest measured RTT; without one (or
// before any measurement) the FEP nearest to its coordinates.
type Destination struct {
	ID        string  `json:"id"`                   // like a FEP id
	Prefix    string  `json:"prefix"`               // CIDR
	Lat       float64 `json:"lat"`                  // degrees, -90..90
	Lon       float64 `json:"lon"`                  // degrees, -180..180
	ProbeAddr string  `json:"probe_addr,omitempty"` // host:port of a TCP listener there (e.g. an origin)
}

// Validate reports the first problem of d, or nil.
func (d Destination) Validate() error {
	if err := ValidateID(d.ID); err != nil {
		return fmt.Errorf("destination id: %w", err)
	}
	if _, err := netip.ParsePrefix(d.Prefix); err != nil {
		return fmt.Errorf("destination %s prefix: %w", d.ID, err)
	}
	if math.IsNaN(d.Lat) || d.Lat < -90 || d.Lat > 90 {
		return fmt.Errorf("destination %s lat %v: want -90..90", d.ID, d.Lat)
	}
	if math.IsNaN(d.Lon) || d.Lon < -180 || d.Lon > 180 {
		return fmt.Errorf("destination %s lon %v: want -180..180", d.ID, d.Lon)
	}
	if d.ProbeAddr != "" {
		if err := validateHostPort(d.ProbeAddr); err != nil {
			return fmt.Errorf("destination %s probe_addr: %w", d.ID, err)
		}
	}
	return nil
}

// DestinationStatus is a destination with its current EgP.
type DestinationStatus struct {
	Destination
	EgP string `json:"egp,omitempty"` // empty while no FEP is registered
	// By says how the EgP was chosen: "rtt" (the lowest RTT measured by a
	// FEP) or "distance" (the FEP nearest to the coordinates).
	By string `json:"by,omitempty"`
	// RTTMS are the RTTs measured to the destination, FEP id -> ms.
	RTTMS map[string]float64 `json:"rtt_ms,omitempty"`
}

// DestinationList is the body of GET /v1/destinations.
type DestinationList struct {
	Destinations []DestinationStatus `json:"destinations"`
}

// Sample is one RTT measurement from the reporting FEP to a peer, or the
// report that the peer stopped answering probes (Unreachable, no RTTMS).
type Sample struct {
	Peer  string    `json:"peer"`
	RTTMS float64   `json:"rtt_ms,omitempty"` // > 0 and <= 60000; absent (0) when Unreachable
	At    time.Time `json:"at"`               // when measured; zero means "now"
	// Unreachable says the peer did not answer for several consecutive
	// probe rounds: the controller stops using the pair as a hop until a
	// later sample carries an RTT again. Optional: older agents never set it.
	Unreachable bool `json:"unreachable,omitempty"`
}

// DestSample is one RTT measurement from the reporting FEP to a destination.
type DestSample struct {
	Dest  string    `json:"dest"`   // destination id
	RTTMS float64   `json:"rtt_ms"` // > 0 and <= 60000
	At    time.Time `json:"at"`     // when measured; zero means "now"
}

// Report is the body of POST /v1/reports: RTTs to peers, to destinations,
// or both.
type Report struct {
	FEP          string       `json:"fep"`
	Samples      []Sample     `json:"samples"`
	Destinations []DestSample `json:"destinations,omitempty"`
	// Stats are the proxy's relay counters (optional): a report may carry
	// only them.
	Stats *ProxyStats `json:"stats,omitempty"`
	// Segments are what an on-path relay (a `tproxy:` entry the
	// controller manages) observed on the legs of the flows it
	// intercepted since its last report (docs/tts.md).
	Segments []SegmentSample `json:"segments,omitempty"`
}

// MaxSegments bounds the segment samples of one report.
const MaxSegments = 1000

// SegmentSample is one leg of an on-path path as a relay at one of its
// ends saw it on the flows it intercepted: the leg runs from From (a relay
// FEP id, or "" for the path's client side) to To (a relay FEP id, or ""
// for the server side); the reporting FEP is one of the two.
type SegmentSample struct {
	Path  string `json:"path"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	Flows int    `json:"flows"` // flows the figures below sum over (> 0)
	// MinRTTMS is the mean over the flows of the leg socket's minimum RTT.
	MinRTTMS float64 `json:"min_rtt_ms"`
	// SegsOut are the data segments the relay sent on the leg, Retrans
	// those it retransmitted (loss = Retrans / SegsOut).
	SegsOut float64 `json:"segs_out"`
	Retrans float64 `json:"retrans"`
}

// Validate reports the first problem of s, or nil.
func (s SegmentSample) Validate(fep string) error {
	if err := ValidateID(s.Path); err != nil {
		return fmt.Errorf("path: %w", err)
	}
	for _, e := range []string{s.From, s.To} {
		if e == "" {
			continue
		}
		if err := ValidateID(e); err != nil {
			return fmt.Errorf("path %s: end: %w", s.Path, err)
		}
	}
	if s.From != fep && s.To != fep {
		return fmt.Errorf("path %s: leg %q-%q: the reporting fep %s is not one of its ends", s.Path, s.From, s.To, fep)
	}
	if s.From == s.To {
		return fmt.Errorf("path %s: leg from %q to itself", s.Path, s.From)
	}
	if s.Flows < 1 || s.Flows > 1e9 {
		return fmt.Errorf("path %s: flows %d: want 1..1e9", s.Path, s.Flows)
	}
	if err := validRTT(s.MinRTTMS, time.Time{}, time.Time{}); err != nil {
		return fmt.Errorf("path %s: %w", s.Path, err)
	}
	if err := validStat("segs_out", s.SegsOut); err != nil {
		return fmt.Errorf("path %s: %w", s.Path, err)
	}
	if err := validStat("retrans", s.Retrans); err != nil {
		return fmt.Errorf("path %s: %w", s.Path, err)
	}
	if s.Retrans > s.SegsOut {
		return fmt.Errorf("path %s: retrans %v > segs_out %v", s.Path, s.Retrans, s.SegsOut)
	}
	return nil
}

// Validate checks r against now (for sample times in the future).
func (r Report) Validate(now time.Time) error {
	if err := ValidateID(r.FEP); err != nil {
		return fmt.Errorf("fep: %w", err)
	}
	if len(r.Samples) == 0 && len(r.Destinations) == 0 && r.Stats == nil && len(r.Segments) == 0 {
		return errors.New("samples, destinations, stats and segments: all empty")
	}
	if len(r.Segments) > MaxSegments {
		return fmt.Errorf("segments: %d > %d", len(r.Segments), MaxSegments)
	}
	for i, s := range r.Segments {
		if err := s.Validate(r.FEP); err != nil {
			return fmt.Errorf("segment %d: %w", i, err)
		}
	}
	if r.Stats != nil {
		if err := r.Stats.Validate(now); err != nil {
			return fmt.Errorf("stats: %w", err)
		}
	}
	if len(r.Destinations) > MaxSamples {
		return fmt.Errorf("destinations: %d > %d", len(r.Destinations), MaxSamples)
	}
	for i, s := range r.Destinations {
		if err := ValidateID(s.Dest); err != nil {
			return fmt.Errorf("destination sample %d dest: %w", i, err)
		}
		if err := validRTT(s.RTTMS, s.At, now); err != nil {
			return fmt.Errorf("destination sample %d dest %s: %w", i, s.Dest, err)
		}
	}
	if len(r.Samples) > MaxSamples {
		return fmt.Errorf("samples: %d > %d", len(r.Samples), MaxSamples)
	}
	for i, s := range r.Samples {
		if err := ValidateID(s.Peer); err != nil {
			return fmt.Errorf("sample %d peer: %w", i, err)
		}
		if s.Peer == r.FEP {
			return fmt.Errorf("sample %d: peer %q is the reporting fep itself", i, s.Peer)
		}
		switch {
		case s.Unreachable && s.RTTMS != 0:
			return fmt.Errorf("sample %d peer %s: rtt_ms %v with unreachable: a sample carries an RTT or says the peer is unreachable, not both", i, s.Peer, s.RTTMS)
		case s.Unreachable:
		case s.RTTMS == 0:
			return fmt.Errorf("sample %d peer %s: no rtt_ms: want rtt_ms > 0 and <= %d, or unreachable: true", i, s.Peer, MaxRTTMS)
		case math.IsNaN(s.RTTMS) || math.IsInf(s.RTTMS, 0) || s.RTTMS < 0 || s.RTTMS > MaxRTTMS:
			return fmt.Errorf("sample %d peer %s: rtt_ms %v: want > 0 and <= %d", i, s.Peer, s.RTTMS, MaxRTTMS)
		}
		if s.At.After(now.Add(MaxClockSkew)) {
			return fmt.Errorf("sample %d peer %s: time %s is in the future", i, s.Peer, s.At.Format(time.RFC3339))
		}
	}
	return nil
}

func validRTT(ms float64, at, now time.Time) error {
	if math.IsNaN(ms) || math.IsInf(ms, 0) || ms <= 0 || ms > MaxRTTMS {
		return fmt.Errorf("rtt_ms %v: want > 0 and <= %d", ms, MaxRTTMS)
	}
	if at.After(now.Add(MaxClockSkew)) {
		return fmt.Errorf("time %s is in the future", at.Format(time.RFC3339))
	}
	return nil
}

// ReportResult is the answer to a report.
type ReportResult struct {
	Accepted int `json:"accepted"` // samples stored
	Changed  int `json:"changed"`  // samples that changed an RTT significantly (trigger a recomputation)
	// Refused samples: about peers this FEP was not asked to measure, or
	// below the speed of light between the two FEPs' coordinates.
	Refused int `json:"refused,omitempty"`
}

// Keys are the table's FEP's share of the overlay keys (per-FEP signing,
// docs/security.md): the controller keeps the overlay secrets and gives
// each FEP only what lets it sign as itself and verify headers sent to it.
// Proxies sign with Current and accept Current, Previous or Next. A
// rotation publishes Next first and makes it Current only once every LoP
// has it, so no proxy signs with a key a peer does not know yet.
type Keys struct {
	Current  *FEPKey `json:"current,omitempty"`
	Previous *FEPKey `json:"previous,omitempty"`
	Next     *FEPKey `json:"next,omitempty"` // accept only
}

// FEPKey is one overlay key id's share of one FEP (hex, 32 bytes each):
// its receive key R(fep) = HMAC(secret, "mosto hop recv v1" 0 fep), the
// keys K(fep->m) = HMAC(R(m), "mosto hop send v1" 0 fep) of the headers it
// sends to each member m of the table, and the overlay's probe key (shared
// by every FEP: it authenticates RTT probe echoes only).
type FEPKey struct {
	ID    uint8             `json:"id"`
	Recv  string            `json:"recv"`
	Send  map[string]string `json:"send,omitempty"`
	Probe string            `json:"probe"`
}

// Egress maps a destination prefix to the egress FEP (EgP) closest to it.
type Egress struct {
	Prefix string `json:"prefix"` // CIDR
	FEP    string `json:"fep"`
}

// Table is the body of GET /v1/tables/{lop}: everything a lookup proxy needs.
type Table struct {
	LoP     string `json:"lop"`
	Version uint64 `json:"version"` // only moves forward within an epoch
	// Epoch names the controller store's life; a table of another epoch
	// replaces the proxy's whatever its version (the store was reset).
	Epoch    string            `json:"epoch,omitempty"`
	Computed time.Time         `json:"computed"`
	Keys     Keys              `json:"keys"`
	Members  map[string]string `json:"members"` // FEP id -> hop_addr, every FEP named in a chain
	// MemberAllow is the controller's member policy (with its member
	// check): the destination policy (relay syntax: "*" any public
	// address, CIDR prefixes) a proxy applies to member dials unless its
	// own hop.member_allow is set. Empty: the controller checks nothing.
	MemberAllow []string           `json:"member_allow,omitempty"`
	Egress      []Egress           `json:"egress,omitempty"` // destination prefix -> EgP
	Table       pathcomp.TableFile `json:"table"`            // only the (InP, EgP) pairs this LoP serves
	// Intercept are the controller's decisions for the on-path relays
	// (docs/tts.md): which relay intercepts which path's flows. A FEP
	// named here applies its entries (an inactive one intercepts
	// nothing new for that path); a FEP not named keeps its own scope.
	Intercept []Intercept `json:"intercept,omitempty"`
}

// Intercept is the decision for one on-path relay on one path.
type Intercept struct {
	FEP    string `json:"fep"`
	Path   string `json:"path"`
	Active bool   `json:"active"`
	// Measured: the decision rests on measurements of every hop (false:
	// the start, every relay intercepting to measure its legs).
	Measured bool `json:"measured,omitempty"`
	// The path's flows: client prefixes, server prefixes, server ports
	// ("80,443,8000-8100"); empty: any.
	Sources []string `json:"sources,omitempty"`
	Dests   []string `json:"dests,omitempty"`
	Ports   string   `json:"ports,omitempty"`
	// Prev and Next are the nearest active relays towards the client
	// and the server ("" = the path's end): the ends of the legs this
	// relay reports on.
	Prev string `json:"prev,omitempty"`
	Next string `json:"next,omitempty"`
}

// Matrix is the body of GET /v1/matrix: the current RTT matrix, in ms. A
// null entry is a pair nobody measured.
type Matrix struct {
	Names []string     `json:"names"`
	RTTMS [][]*float64 `json:"rtt_ms"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status  string `json:"status"` // "ok"
	Leader  bool   `json:"leader"` // this controller computes tables
	Version uint64 `json:"version"`
	FEPs    int    `json:"feps"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
}
