package relay

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/mosto-net/mosto/internal/activation"
)

// Config is the configuration of one proxy daemon, as read from YAML. The
// zero value of every optional field means "use the default" (see Defaults).
type Config struct {
	// ID is this FEP's name: a location of the chain table and a key of Members.
	ID string `yaml:"id"`
	// Hop is the listener for connections from other members.
	Hop HopConfig `yaml:"hop"`
	// Members maps FEP id to hop address (host:port).
	Members map[string]string `yaml:"members"`
	// Keys are the overlay keys that sign and verify hop headers.
	Keys KeysConfig `yaml:"keys"`
	// Table is the chain table file written by `mosto plan table --json`.
	// Empty: no chains, every flow goes direct from the InP.
	Table string `yaml:"table"`
	// LoP is the lookup proxy this InP sends its flows to when it holds no
	// table: the LoP completes each flow's route from its own table (seed
	// Sec. III-C). Empty: this FEP looks chains up itself. See lookup.go.
	LoP string `yaml:"lop"`
	// Workers is the number of processes `mosto proxy` runs for this FEP,
	// sharing every listener with SO_REUSEPORT; 0 or 1: one process.
	Workers int `yaml:"workers"`
	// Loops is the number of event-loop threads that carry service
	// flows (internal/evloop) until they turn bulk; 0: one per CPU
	// (GOMAXPROCS); -1: off, every flow runs on goroutines.
	Loops int `yaml:"loops"`
	// Egress maps destinations to the FEP closest to them (the EgP).
	Egress EgressConfig `yaml:"egress"`
	// Destinations is this FEP's policy as EgP: where it may connect.
	Destinations PolicyConfig `yaml:"destinations"`
	// ProxyProtocol lists origins (same matcher syntax as allow lists) that
	// receive a standard PROXY v2 header with the client's addresses.
	ProxyProtocol []string `yaml:"proxy_protocol"`

	Services    []ServiceConfig `yaml:"services"`
	SOCKS5      *SOCKS5Config   `yaml:"socks5"`
	HTTPConnect *ConnectConfig  `yaml:"http_connect"`
	TProxy      *TProxyConfig   `yaml:"tproxy"` // transparent interception (tproxy.go)

	// Managed means a controller agent supplies chains, members and keys
	// at run time (SetChains, SetMemberSource, SetKeySource), so members,
	// keys and table may be missing. It is not part of this package's YAML:
	// `mosto proxy` sets it for a file with a `controller:` section, which
	// internal/agent owns (agent.Section).
	Managed bool `yaml:"-"`

	Timeouts TimeoutConfig `yaml:"timeouts"`
	Limits   LimitConfig   `yaml:"limits"`
	Socket   SocketConfig  `yaml:"socket"`
	Metrics  MetricsConfig `yaml:"metrics"`
	// Pool keeps pre-established connections to members and origins.
	Pool PoolConfig `yaml:"pool"`
	// Offload leaves the data path of flows after slow start (offload.go).
	Offload OffloadConfig `yaml:"offload"`
	// SizeLearning learns the size hint of the InP's flows per service or
	// destination (sizelearn.go); on by default.
	SizeLearning SizeLearnConfig `yaml:"size_learning"`

	// Activated are listening sockets passed by systemd (socket
	// activation, internal/activation): bind takes them instead of
	// binding, matched by name (hop, service-NAME, socks5, http_connect,
	// metrics) or address; one no listener takes is an error.
	Activated []activation.Socket `yaml:"-"`

	// dir is the directory relative file names are resolved against.
	dir string
}

// HopConfig is the hop listener.
type HopConfig struct {
	Listen string `yaml:"listen"`
	// MaxSkew is the largest clock difference accepted in a header's time.
	MaxSkew Duration `yaml:"max_skew"`
	// MemberIdle is how long a hop connection from a member's address (an
	// IP literal of members) may wait for the first byte of its header: the
	// members' pooled connections wait here. Once the first byte arrived,
	// and for every other source, the header timeout applies. 0: the header
	// timeout for all.
	MemberIdle Duration `yaml:"member_idle"`
	// ReplayEntries sizes the replay cache (headers remembered for 2 x
	// max_skew); 0: DefaultReplayEntries. Size it above the hop flows per
	// second times 2 x max_skew: mosto_relay_replay_evictions_total counts
	// the headers forgotten early (a replay of one would pass).
	ReplayEntries int `yaml:"replay_entries"`
	// MemberAllow is the destination policy of member dials (same syntax
	// and rules as destinations.allow: special-purpose addresses only when
	// an entry names them; a member given by name is resolved and its
	// addresses checked). Set, it overrides the member policy a
	// controller sends with its table. Unset: the controller's policy
	// (with its member check, the default: public addresses and its
	// --allow-member-net ranges); with no controller policy (static
	// members, or `--member-check=false`) any member address except
	// link-local, multicast and unspecified ones (labs, private overlays).
	MemberAllow []string `yaml:"member_allow"`
}

// PoolConfig sizes the pools of pre-established connections (0: no pool).
// A pooled connection is used by one flow, then closed with it.
type PoolConfig struct {
	// Hop is the number of idle connections kept to every member. The
	// members learn it from the pool hello. A config file without the key
	// gets DefaultPoolHop; 0 turns pools off.
	Hop int `yaml:"hop"`
	// HopMaxIdle is the age after which a pooled hop connection is
	// replaced; 0: DefaultHopMaxIdle.
	HopMaxIdle Duration `yaml:"hop_max_idle"`
	// Origin is the number of idle connections kept, at the EgP, to every
	// origin address it connected to in the last 10 minutes.
	Origin int `yaml:"origin"`
	// OriginMaxIdle is the age after which a pooled origin connection is
	// replaced, below the origins' keep-alive timeouts; 0:
	// DefaultOriginMaxIdle.
	OriginMaxIdle Duration `yaml:"origin_max_idle"`
}

// KeysConfig holds the current overlay key and, during rotation, the previous one.
type KeysConfig struct {
	Current  *KeyConfig `yaml:"current"`
	Previous *KeyConfig `yaml:"previous"`
}

// KeyConfig is one overlay key: an id and a secret given in hex or in a file
// (raw bytes, or hex if the file holds only hex digits).
type KeyConfig struct {
	ID         uint8  `yaml:"id"`
	SecretHex  string `yaml:"secret_hex"`
	SecretFile string `yaml:"secret_file"`
}

// EgressConfig is the static destination -> EgP map.
type EgressConfig struct {
	// Default is the EgP of destinations no route matches; empty means this FEP.
	Default string        `yaml:"default"`
	Routes  []EgressRoute `yaml:"routes"`
}

// EgressRoute sends destinations matching Match to FEP.
type EgressRoute struct {
	Match string `yaml:"match"`
	FEP   string `yaml:"fep"`
}

// PolicyConfig is a destination allowlist. Each entry is a CIDR ("10.0.0.0/8"),
// an address, a host name, a "*.suffix" wildcard, or any of those with
// ":port" (IPv6 in brackets). An empty list allows every public destination.
// Private, loopback, link-local, multicast and unspecified addresses are
// denied unless an entry names them (a CIDR containing them or the host name
// that resolved to them).
type PolicyConfig struct {
	Allow []string `yaml:"allow"`
}

// ServiceConfig is a fixed listener -> origin mapping, like a CDN distribution.
type ServiceConfig struct {
	Name   string `yaml:"name"`
	Listen string `yaml:"listen"`
	Origin string `yaml:"origin"` // host:port
	Size   Size   `yaml:"size"`   // expected transfer size, picks the chain class
}

// SOCKS5Config is the SOCKS5 entry (RFC 1928 CONNECT, RFC 1929 auth).
type SOCKS5Config struct {
	Listen string            `yaml:"listen"`
	Users  map[string]string `yaml:"users"` // empty: no authentication
	Allow  []string          `yaml:"allow"` // destination allowlist; empty: any
	Size   Size              `yaml:"size"`  // size hint for chain choice
	// AllowOpen lets the entry listen on a non-loopback address without
	// users and without an allowlist (an open proxy); refused otherwise.
	AllowOpen bool `yaml:"allow_open"`
}

// ConnectConfig is the HTTP CONNECT entry.
type ConnectConfig struct {
	Listen string            `yaml:"listen"`
	Users  map[string]string `yaml:"users"` // basic auth; empty: none
	Allow  []string          `yaml:"allow"`
	Size   Size              `yaml:"size"`
	// AllowOpen: as SOCKS5Config.AllowOpen.
	AllowOpen bool `yaml:"allow_open"`
}

// TimeoutConfig groups the daemon's timeouts.
type TimeoutConfig struct {
	Header  Duration `yaml:"header"`  // reading a hop header or an entry handshake
	Connect Duration `yaml:"connect"` // dialing the next hop or the origin
	Idle    Duration `yaml:"idle"`    // no data in either direction
	Drain   Duration `yaml:"drain"`   // waiting for flows on shutdown
	// Early is how long a service entry waits for the client's first bytes
	// to send them with the hop header (in the SYN with Fast Open); 0:
	// DefaultEarlyWait with socket.fastopen, no wait without.
	Early Duration `yaml:"early"`
}

// LimitConfig bounds concurrent connections.
type LimitConfig struct {
	MaxConns          int `yaml:"max_conns"`            // entry listeners together
	MaxConnsPerSource int `yaml:"max_conns_per_source"` // entry listeners, per client IP (IPv6: per /64)
	// HopMaxConns is the hop listener's own budget (a hop-port flood
	// cannot take the entries' connections); 0: MaxConns.
	HopMaxConns int `yaml:"hop_max_conns"`
	// HopMaxConnsPerSource bounds the hop connections of one source that
	// is not a member (IPv6: per /64); members' addresses are not capped;
	// 0: DefaultHopMaxConnsPerSource.
	HopMaxConnsPerSource int `yaml:"hop_max_conns_per_source"`
}

// SocketConfig holds options set on every hop and origin socket.
type SocketConfig struct {
	RcvBuf       Size   `yaml:"rcvbuf"` // SO_RCVBUF; 0: kernel autotuning
	SndBuf       Size   `yaml:"sndbuf"` // SO_SNDBUF; 0: kernel autotuning
	NoDelay      *bool  `yaml:"nodelay"`
	Congestion   string `yaml:"congestion"`    // TCP_CONGESTION, e.g. bbr, cubic
	NotSentLowat Size   `yaml:"notsent_lowat"` // TCP_NOTSENT_LOWAT; 0: kernel default
	// FastOpen enables TCP Fast Open: TCP_FASTOPEN on the listeners and
	// TCP_FASTOPEN_CONNECT on hop and origin connections, so a hop header
	// rides in the SYN once the kernel holds the peer's cookie (needs
	// sysctl net.ipv4.tcp_fastopen=3 on both ends; without it the SYN is a
	// plain one). On in a config file without the key; false turns it off.
	FastOpen bool `yaml:"fastopen"`
	// ReusePort sets SO_REUSEPORT on the hop and entry listeners, so several
	// processes (workers, or an old and a new daemon during an upgrade)
	// serve the same ports; implied by workers > 1.
	ReusePort bool `yaml:"reuseport"`
	// KeepAlive is the TCP keepalive idle time and interval; 0: off (the
	// idle timeout ends dead flows, and keepalive costs syscalls per flow).
	KeepAlive Duration `yaml:"keepalive"`
}

// MetricsConfig is the HTTP listener for /metrics and /healthz.
type MetricsConfig struct {
	Listen string `yaml:"listen"` // empty: no metrics listener
	// PProf also serves Go's profiles under /debug/pprof/ on the metrics
	// listener (off by default: profiles reveal internals and cost CPU).
	PProf bool `yaml:"pprof"`
}

// Defaults used when a field is zero.
const (
	DefaultHeaderTimeout     = 5 * time.Second
	DefaultConnectTimeout    = 5 * time.Second
	DefaultIdleTimeout       = 5 * time.Minute
	DefaultDrainTimeout      = 30 * time.Second
	DefaultMaxSkew           = 30 * time.Second
	DefaultMaxConns          = 32768
	DefaultMaxConnsPerSource = 1024
	// DefaultHopMaxConnsPerSource caps the hop connections of a non-member
	// address: a stranger may probe the port, not hold its budget.
	DefaultHopMaxConnsPerSource = 64
	// DefaultReplayEntries is hop.replay_entries when zero: about 4.4k hop
	// flows/s at the default max_skew (30 s).
	DefaultReplayEntries = 1 << 18
	// MaxReplayEntries bounds hop.replay_entries (about 100 bytes each).
	MaxReplayEntries     = 1 << 24
	DefaultEarlyWait     = 20 * time.Millisecond
	DefaultHopMaxIdle    = 30 * time.Second
	DefaultOriginMaxIdle = 20 * time.Second
	// DefaultPoolHop is pool.hop when a config file does not set it: idle
	// connections kept to every member (safe with members that lack pools:
	// the pool hello falls back to per-flow dials).
	DefaultPoolHop = 2
	// MaxPool bounds pool.hop and pool.origin.
	MaxPool = 64
	// MaxWorkers bounds workers.
	MaxWorkers = 64
	// MaxLoops bounds loops.
	MaxLoops = 256
)

// Duration is a time.Duration written as "5s", "1m30s".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: duration %q: %w", n.Line, s, err)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %q is negative", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// Size is a byte count written as an integer or with a decimal unit:
// "450KB", "15MB", "1GB" (1 KB = 1000 bytes).
type Size int64

// UnmarshalYAML parses a size.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	var str string
	if err := n.Decode(&str); err != nil {
		return err
	}
	v, err := ParseSize(str)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*s = Size(v)
	return nil
}

// ParseSize parses "1500", "450KB", "15MB", "2GB" (decimal units, B optional).
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a non-negative integer with optional KB, MB or GB", s)
	}
	return v * mult, nil
}

// LoadConfig reads and validates a YAML config file. Relative file names in
// it are resolved against the file's directory.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	defer f.Close()
	cfg, err := ParseConfig(f, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes a YAML config strictly (unknown keys are errors with
// their line) and validates it. dir resolves relative file names. A file
// with other sections beside the daemon's (`controller:`) is composed by
// its reader: start from FileDefaults, DecodeYAML, SetDir, Validate.
func ParseConfig(r io.Reader, dir string) (*Config, error) {
	cfg := FileDefaults()
	if err := DecodeYAML(r, &cfg); err != nil {
		return nil, err
	}
	cfg.SetDir(dir)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// FileDefaults is the Config a configuration file starts from. A config
// file gets the levers that are safe with any peer (docs/proxy.md,
// "Defaults"): hop pools and TCP Fast Open. Set pool.hop: 0 or
// socket.fastopen: false to turn them off.
func FileDefaults() Config {
	return Config{Pool: PoolConfig{Hop: DefaultPoolHop}, Socket: SocketConfig{FastOpen: true}}
}

// DecodeYAML decodes r (at most 16 MiB) as exactly one YAML document into
// v, strictly: an unknown key is an error naming its line.
func DecodeYAML(r io.Reader, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, 16<<20))
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("config is empty")
		}
		return fmt.Errorf("decode config: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("config holds more than one YAML document")
	}
	return nil
}

// SetDir sets the directory relative file names are resolved against.
func (c *Config) SetDir(dir string) { c.dir = dir }

// Validate checks the config for errors an operator must fix. It does not
// read key or table files (New does).
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.ID == "" {
		bad("id: missing (this FEP's name in the chain table)")
	}
	if c.Hop.Listen != "" {
		if err := checkHostPort(c.Hop.Listen, true); err != nil {
			bad("hop.listen: %v", err)
		}
	}
	for id, addr := range c.Members {
		if id == "" {
			bad("members: empty FEP id")
		}
		if err := checkHostPort(addr, false); err != nil {
			bad("members.%s: %v", id, err)
		}
	}
	managed := c.Managed // members and keys may come from the controller
	if c.Keys.Current == nil {
		if !managed && (len(c.Members) > 0 || c.Hop.Listen != "") {
			bad("keys.current: missing (needed to sign and verify hop headers)")
		}
	} else {
		if err := c.Keys.Current.check(); err != nil {
			bad("keys.current: %v", err)
		}
	}
	if c.Keys.Previous != nil {
		if err := c.Keys.Previous.check(); err != nil {
			bad("keys.previous: %v", err)
		}
		if c.Keys.Current != nil && c.Keys.Previous.ID == c.Keys.Current.ID {
			bad("keys.previous: id %d equals keys.current's", c.Keys.Previous.ID)
		}
	}
	if !managed && c.Egress.Default != "" && c.Egress.Default != c.ID && c.Members[c.Egress.Default] == "" {
		bad("egress.default: %q is not a member", c.Egress.Default)
	}
	for i, r := range c.Egress.Routes {
		if _, err := parseMatcher(r.Match); err != nil {
			bad("egress.routes[%d].match: %v", i, err)
		}
		if r.FEP == "" || (!managed && r.FEP != c.ID && c.Members[r.FEP] == "") {
			bad("egress.routes[%d].fep: %q is not a member", i, r.FEP)
		}
	}
	checkList := func(key string, list []string) {
		for i, m := range list {
			if _, err := parseMatcher(m); err != nil {
				bad("%s[%d]: %v", key, i, err)
			}
		}
	}
	checkList("destinations.allow", c.Destinations.Allow)
	checkList("hop.member_allow", c.Hop.MemberAllow)
	checkList("proxy_protocol", c.ProxyProtocol)
	for i, s := range c.Services {
		if err := checkHostPort(s.Listen, true); err != nil {
			bad("services[%d].listen: %v", i, err)
		}
		if err := checkHostPort(s.Origin, false); err != nil {
			bad("services[%d].origin: %v", i, err)
		}
	}
	if s := c.SOCKS5; s != nil {
		if err := checkHostPort(s.Listen, true); err != nil {
			bad("socks5.listen: %v", err)
		}
		checkList("socks5.allow", s.Allow)
		if openListen(s.Listen) && len(s.Users) == 0 && len(s.Allow) == 0 && !s.AllowOpen {
			bad("socks5: %s is not a loopback address and the entry has no users and no allow list: anyone reaching it could use this proxy (set users or allow, or allow_open: true)", s.Listen)
		}
		for u, p := range s.Users {
			if len(u) == 0 || len(u) > 255 || len(p) == 0 || len(p) > 255 {
				bad("socks5.users: user and password must be 1-255 bytes (user %q)", u)
			}
		}
	}
	if t := c.TProxy; t != nil {
		if err := t.validate(c); err != nil {
			bad("tproxy: %v", err)
		}
	}
	if h := c.HTTPConnect; h != nil {
		if err := checkHostPort(h.Listen, true); err != nil {
			bad("http_connect.listen: %v", err)
		}
		checkList("http_connect.allow", h.Allow)
		if openListen(h.Listen) && len(h.Users) == 0 && len(h.Allow) == 0 && !h.AllowOpen {
			bad("http_connect: %s is not a loopback address and the entry has no users and no allow list: anyone reaching it could use this proxy (set users or allow, or allow_open: true)", h.Listen)
		}
		for u := range h.Users {
			if u == "" || strings.Contains(u, ":") {
				bad("http_connect.users: user %q must be non-empty without ':'", u)
			}
		}
	}
	if c.Hop.ReplayEntries < 0 || c.Hop.ReplayEntries > MaxReplayEntries {
		bad("hop.replay_entries: %d, want 0..%d", c.Hop.ReplayEntries, MaxReplayEntries)
	}
	if c.Limits.MaxConns < 0 || c.Limits.MaxConnsPerSource < 0 || c.Limits.HopMaxConns < 0 || c.Limits.HopMaxConnsPerSource < 0 {
		bad("limits: values must be >= 0")
	}
	if c.Metrics.Listen != "" {
		if err := checkHostPort(c.Metrics.Listen, true); err != nil {
			bad("metrics.listen: %v", err)
		}
	}
	if c.Socket.RcvBuf > 1<<30 || c.Socket.SndBuf > 1<<30 || c.Socket.NotSentLowat > 1<<30 {
		bad("socket: buffer sizes must be <= 1GB")
	}
	c.SizeLearning.validate(bad)
	if c.Pool.Hop < 0 || c.Pool.Hop > MaxPool || c.Pool.Origin < 0 || c.Pool.Origin > MaxPool {
		bad("pool: hop and origin must be 0-%d", MaxPool)
	}
	if c.Pool.Hop > 0 && c.Pool.HopMaxIdle != 0 && time.Duration(c.Pool.HopMaxIdle) < 100*time.Millisecond {
		bad("pool.hop_max_idle: %v is below 100ms", time.Duration(c.Pool.HopMaxIdle))
	}
	if c.Pool.Origin > 0 && c.Pool.OriginMaxIdle != 0 && time.Duration(c.Pool.OriginMaxIdle) < 100*time.Millisecond {
		bad("pool.origin_max_idle: %v is below 100ms", time.Duration(c.Pool.OriginMaxIdle))
	}
	if len(c.Socket.Congestion) > 15 {
		bad("socket.congestion: %q is too long", c.Socket.Congestion)
	}
	switch lop := c.LoP; {
	case lop == "":
	case lop == c.ID:
		bad("lop: %q is this FEP's id; omit lop to look chains up locally", lop)
	case !managed && c.Members[lop] == "":
		bad("lop: %q is not a member", lop)
	}
	if c.Loops < -1 || c.Loops > MaxLoops {
		bad("loops: %d, want -1 (off), 0 (one per CPU) or 1-%d", c.Loops, MaxLoops)
	}
	if c.Workers < 0 || c.Workers > MaxWorkers {
		bad("workers: %d, want 0-%d", c.Workers, MaxWorkers)
	}
	if err := c.Offload.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (k *KeyConfig) check() error {
	if (k.SecretHex == "") == (k.SecretFile == "") {
		return errors.New("set exactly one of secret_hex and secret_file")
	}
	if k.SecretHex != "" {
		if _, err := hex.DecodeString(k.SecretHex); err != nil {
			return fmt.Errorf("secret_hex: %w", err)
		}
	}
	return nil
}

// secret returns the key bytes, reading the file if needed.
func (k *KeyConfig) secret(dir string) ([]byte, error) {
	if k.SecretHex != "" {
		return hex.DecodeString(k.SecretHex)
	}
	p := k.SecretFile
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if h, err := hex.DecodeString(t); err == nil && len(t) > 0 {
		return h, nil
	}
	return b, nil
}

// Path resolves a file name of the config against the config's directory.
func (c *Config) Path(p string) string { return c.path(p) }

// Dir is the directory relative file names are resolved against.
func (c *Config) Dir() string { return c.dir }

func (c *Config) path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(c.dir, p)
}

// checkHostPort checks "host:port"; a listen address may have an empty host
// and port 0.
// openListen reports whether a listen address may be reached from other
// hosts: every interface (no host, 0.0.0.0, ::), or any address or name
// but loopback ones and localhost.
func openListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.Unmap().IsLoopback()
}

func checkHostPort(s string, listen bool) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("%q: bad port", s)
	}
	if !listen && (host == "" || p == 0) {
		return fmt.Errorf("%q: want host:port", s)
	}
	return nil
}

func (c *Config) headerTimeout() time.Duration {
	return orDefault(c.Timeouts.Header, DefaultHeaderTimeout)
}
func (c *Config) connectTimeout() time.Duration {
	return orDefault(c.Timeouts.Connect, DefaultConnectTimeout)
}
func (c *Config) idleTimeout() time.Duration { return orDefault(c.Timeouts.Idle, DefaultIdleTimeout) }
func (c *Config) drainTimeout() time.Duration {
	return orDefault(c.Timeouts.Drain, DefaultDrainTimeout)
}
func (c *Config) earlyWait() time.Duration {
	if c.Timeouts.Early == 0 && !c.Socket.FastOpen {
		return 0
	}
	return orDefault(c.Timeouts.Early, DefaultEarlyWait)
}
func (c *Config) hopMaxIdle() time.Duration {
	return orDefault(c.Pool.HopMaxIdle, DefaultHopMaxIdle)
}
func (c *Config) originMaxIdle() time.Duration {
	return orDefault(c.Pool.OriginMaxIdle, DefaultOriginMaxIdle)
}
func (c *Config) maxSkew() time.Duration { return orDefault(c.Hop.MaxSkew, DefaultMaxSkew) }

func orDefault(d Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}
