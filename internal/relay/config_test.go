package relay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadConfigExample(t *testing.T) {
	cfg, err := LoadConfig("testdata/proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != "fra" || len(cfg.Members) != 3 || cfg.Services[0].Size != 450000 ||
		cfg.Socket.NotSentLowat != 128000 || cfg.timeoutsIdle() != 5*time.Minute || cfg.SOCKS5.Users["alice"] != "secret" {
		t.Errorf("decoded %+v", cfg)
	}
	if err := Check(cfg); err != nil {
		t.Fatalf("Check: %v", err)
	}
	kr, err := loadKeyring(cfg)
	if err != nil || kr.CurrentID() != 2 {
		t.Fatalf("keyring: %v", err)
	}
	ix, err := loadTable(cfg.path(cfg.Table))
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := ix.Lookup("fra", "lon", 10e6); !ok || len(e.Path) != 3 {
		t.Errorf("table lookup = %v, %v", e, ok)
	}
}

func (c *Config) timeoutsIdle() time.Duration { return c.idleTimeout() }

func TestParseConfigErrors(t *testing.T) {
	const keys = "keys: {current: {id: 1, secret_hex: 000102030405060708090a0b0c0d0e0f}}\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown key with line", "id: a\nhop:\n  listen: :1\n  bogus: 1\n" + keys, "line 4: field bogus not found"},
		{"no id", "hop: {listen: ':1'}\n" + keys, "id: missing"},
		{"empty", "", "config is empty"},
		{"two documents", "id: a\n---\nid: b\n", "more than one YAML document"},
		{"bad duration", "id: a\ntimeouts: {idle: 5 minutes}\n", "line 2: duration"},
		{"negative duration", "id: a\ntimeouts: {idle: -5s}\n", "negative"},
		{"bad size", "id: a\nservices: [{listen: ':1', origin: 'x:1', size: 12XB}]\n", "size \"12XB\""},
		{"member address", "id: a\nmembers: {b: nowhere}\n" + keys, "members.b"},
		{"hop without keys", "id: a\nhop: {listen: ':1'}\n", "keys.current: missing"},
		{"both secrets", "id: a\nkeys: {current: {id: 1, secret_hex: 00, secret_file: f}}\n", "exactly one"},
		{"same key ids", "id: a\nkeys: {current: {id: 1, secret_hex: 00}, previous: {id: 1, secret_hex: 01}}\n", "equals keys.current"},
		{"egress not member", "id: a\negress: {default: z}\n", "egress.default"},
		{"route not member", "id: a\negress: {routes: [{match: 10.0.0.0/8, fep: z}]}\n", "egress.routes[0].fep"},
		{"bad pattern", "id: a\ndestinations: {allow: ['10.0.0.0/33']}\n", "destinations.allow[0]"},
		{"service origin", "id: a\nservices: [{listen: ':1', origin: ':80'}]\n", "services[0].origin"},
		{"socks user", "id: a\nsocks5: {listen: ':1', users: {'': x}}\n", "socks5.users"},
		{"connect user colon", "id: a\nhttp_connect: {listen: ':1', users: {'a:b': x}}\n", "http_connect.users"},
		// issue 13 item 9: no open proxy by accident.
		{"open socks5", "id: a\nsocks5: {listen: ':1080'}\n", "allow_open"},
		{"open socks5 public ip", "id: a\nsocks5: {listen: '192.0.2.1:1080'}\n", "allow_open"},
		{"open connect", "id: a\nhttp_connect: {listen: '0.0.0.0:3128'}\n", "allow_open"},
		{"negative limit", "id: a\nlimits: {max_conns: -1}\n", "limits"},
		{"wrong type", "id: [a]\n", "cannot unmarshal"},
		{"lop not member", "id: a\nmembers: {b: 'h:1'}\nlop: z\n" + keys, "lop: \"z\" is not a member"},
		{"lop is self", "id: a\nmembers: {b: 'h:1'}\nlop: a\n" + keys, "lop: \"a\" is this FEP's id"},
		{"lop without keys", "id: a\nmembers: {b: 'h:1'}\nlop: b\n", "keys.current: missing"},
		{"negative workers", "id: a\nworkers: -1\n", "workers: -1"},
		{"too many workers", "id: a\nworkers: 65\n", "workers: 65, want 0-64"},
		{"loops too low", "id: a\nloops: -2\n", "loops: -2"},
		{"too many loops", "id: a\nloops: 257\n", "loops: 257"},
		{"reuseport not bool", "id: a\nsocket: {reuseport: maybe}\n", "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(strings.NewReader(tc.yaml), ".")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseConfig = %v; want error containing %q", err, tc.want)
			}
		})
	}
}

// TestManagedConfig checks that a managed config (a controller agent
// supplies members and keys later) accepts a hop listener without keys and
// an EgP outside members, which an unmanaged one refuses; and that this
// package's YAML has no controller section (internal/agent owns it).
func TestManagedConfig(t *testing.T) {
	y := "id: a\nhop: {listen: '127.0.0.1:0'}\negress: {default: z}\n"
	if _, err := ParseConfig(strings.NewReader(y), "."); err == nil {
		t.Fatal("unmanaged config without keys accepted")
	}
	if _, err := ParseConfig(strings.NewReader(y+"controller: {url: 'http://c:1'}\n"), "."); err == nil || !strings.Contains(err.Error(), "field controller not found") {
		t.Fatalf("ParseConfig with a controller section = %v; want it unknown here", err)
	}
	cfg := FileDefaults()
	if err := DecodeYAML(strings.NewReader(y), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Managed = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.key")
	os.WriteFile(short, []byte("tooshort"), 0o600)
	badTable := filepath.Join(dir, "t.json")
	os.WriteFile(badTable, []byte(`{"locations":["a"],"chains":[{"from":"a","to":"b","rounds":1,"path":["a","b"]}]}`), 0o600)
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"short key", "id: a\nkeys: {current: {id: 1, secret_file: short.key}}\n", "secret of 8 bytes"},
		{"missing key file", "id: a\nkeys: {current: {id: 1, secret_file: none.key}}\n", "read key"},
		{"bad table", "id: a\ntable: t.json\n", "unknown location"},
		{"missing table", "id: a\ntable: none.json\n", "chain table"},
		{"port in use", "id: a\nservices: [{listen: 'LISTEN', origin: 'x:1'}, {listen: 'LISTEN', origin: 'x:1'}]\n", "address already in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := strings.ReplaceAll(tc.yaml, "LISTEN", "127.0.0.1:"+freePort(t))
			cfg, err := ParseConfig(strings.NewReader(y), dir)
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(cfg, nil)
			if err == nil {
				s.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v; want error containing %q", err, tc.want)
			}
		})
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	s, err := New(&Config{ID: "x", Services: []ServiceConfig{{Listen: "127.0.0.1:0", Origin: "x:1"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, p, _ := strings.Cut(s.ServiceAddr(0).String(), ":")
	return p
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1500", 1500, true}, {"450KB", 450000, true}, {"15 MB", 15e6, true},
		{"2g", 2e9, true}, {"7B", 7, true}, {"1k", 1000, true},
		{"", 0, false}, {"-1", 0, false}, {"1.5MB", 0, false}, {"KB", 0, false}, {"9223372036854775807GB", 0, false},
	} {
		got, err := ParseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	if b, err := os.ReadFile("testdata/proxy.yaml"); err == nil {
		f.Add(string(b))
	}
	f.Add("id: a\n")
	f.Add("id: a\nservices: [{listen: ':1', origin: 'x:1', size: 1GB}]\n")
	f.Add("id: a\negress: {routes: [{match: '[::1]:80', fep: a}]}\n")
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := ParseConfig(strings.NewReader(s), "testdata")
		if err != nil {
			return
		}
		if cfg.ID == "" {
			t.Fatal("accepted a config without id")
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
	})
}

// TestLeverDefaults checks that a config file gets hop pools and Fast Open
// unless it turns them off, and that a Go Config literal gets neither.
func TestLeverDefaults(t *testing.T) {
	const base = "id: a\nservices: [{name: s, listen: 127.0.0.1:0, origin: 127.0.0.1:1}]\n"
	for _, tc := range []struct {
		name     string
		extra    string
		pool     int
		fastOpen bool
	}{
		{"absent", "", DefaultPoolHop, true},
		{"off", "pool: {hop: 0}\nsocket: {fastopen: false}\n", 0, false},
		{"other keys in the sections", "pool: {origin: 1}\nsocket: {nodelay: true}\n", DefaultPoolHop, true},
		{"more", "pool: {hop: 5}\n", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig(strings.NewReader(base+tc.extra), ".")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Pool.Hop != tc.pool || cfg.Socket.FastOpen != tc.fastOpen {
				t.Errorf("pool.hop %d, socket.fastopen %v; want %d, %v", cfg.Pool.Hop, cfg.Socket.FastOpen, tc.pool, tc.fastOpen)
			}
		})
	}
	var lit Config
	if lit.Pool.Hop != 0 || lit.Socket.FastOpen {
		t.Errorf("a Config literal has levers on")
	}
}

// TestOpenEntryAllowed (issue 13 item 9): an entry without users or allow
// list starts on loopback, or anywhere with allow_open, users or an allow
// list.
func TestOpenEntryAllowed(t *testing.T) {
	for _, y := range []string{
		"id: a\nsocks5: {listen: '127.0.0.1:1080'}\n",
		"id: a\nsocks5: {listen: '[::1]:1080'}\n",
		"id: a\nsocks5: {listen: 'localhost:1080'}\n",
		"id: a\nsocks5: {listen: ':1080', allow_open: true}\n",
		"id: a\nsocks5: {listen: ':1080', users: {u: p}}\n",
		"id: a\nhttp_connect: {listen: ':3128', allow: ['*:443']}\n",
	} {
		if _, err := ParseConfig(strings.NewReader(y), "."); err != nil {
			t.Errorf("ParseConfig(%q) = %v; want ok", y, err)
		}
	}
}
