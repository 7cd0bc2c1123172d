package routerbench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/template"

	"github.com/mosto-net/mosto/internal/emu"
	"github.com/mosto-net/mosto/internal/topo"
)

// Ports inside the world.
const (
	portHandoff  = 80
	portRedirect = 81
	portProxy    = 82
	portTriangle = 83 // handoff, surrogate-side placement
	portAgent    = 7070
	portLB       = 8000
	portDNS      = 53
	portCache    = 8080
	portOrigin   = 9000
	dnsName      = "cdn.mosto.test"
)

// worldSpec: clients c1..cN (one per hop count), forwarding hosts h1..h8,
// rr, s1, s2, origin. Client cK reaches rr, s1 and s2 through h1..hK;
// every segment, and every other pair, has hopMS one way, except the
// surrogates' path to the origin (originMS). With rrOnPath the clients
// reach s1 and s2 through h1..hK and then rr (a plain forwarder for them):
// the router sits on the path as a site's front router would, and a
// direct fetch crosses it as a handed-off response does.
func worldSpec(hops []int, hopMS, originMS float64, rrOnPath bool) *emu.Spec {
	maxHops := 0
	for _, h := range hops {
		maxHops = max(maxHops, h)
	}
	var hosts []emu.HostSpec
	for _, h := range hops {
		hosts = append(hosts, emu.HostSpec{Name: clientName(h)})
	}
	for i := 1; i <= maxHops; i++ {
		hosts = append(hosts, emu.HostSpec{Name: "h" + strconv.Itoa(i)})
	}
	hosts = append(hosts, emu.HostSpec{Name: "rr"}, emu.HostSpec{Name: "s1"}, emu.HostSpec{Name: "s2"}, emu.HostSpec{Name: "origin"})
	routed := map[[2]string]bool{}
	var routes []emu.RouteSpec
	for _, h := range hops {
		var via []string
		for i := 1; i <= h; i++ {
			via = append(via, "h"+strconv.Itoa(i))
		}
		for _, to := range []string{"rr", "s1", "s2"} {
			v := via
			if rrOnPath && to != "rr" {
				v = append(slices.Clone(via), "rr")
			}
			routes = append(routes, emu.RouteSpec{From: clientName(h), To: to, Via: v})
			routed[[2]string{clientName(h), to}] = true
			routed[[2]string{to, clientName(h)}] = true
		}
	}
	var links []emu.LinkSpec
	for i := range hosts {
		for j := i + 1; j < len(hosts); j++ {
			a, b := hosts[i].Name, hosts[j].Name
			if routed[[2]string{a, b}] {
				continue
			}
			d := hopMS
			if (a == "s1" || a == "s2" || b == "s1" || b == "s2") && (a == "origin" || b == "origin") {
				d = originMS
			}
			links = append(links, emu.LinkSpec{A: a, B: b, DelayMS: &d})
		}
	}
	return &emu.Spec{Name: "rtbench", Hosts: hosts, Links: links, Routes: routes}
}

func clientName(hops int) string { return "c" + strconv.Itoa(hops) }

func hostPort(w *emu.World, host string, port int) string {
	return net.JoinHostPort(w.Addr(host).String(), strconv.Itoa(port))
}

// nginxHead opens every nginx config of the bench: one worker, files in
// the instance's directory, an http block without access log.
const nginxHead = `worker_processes 1;
error_log {{.Dir}}/error.log warn;
pid {{.Dir}}/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path {{.Dir}}/proxy;
    fastcgi_temp_path {{.Dir}}/fastcgi;
    uwsgi_temp_path {{.Dir}}/uwsgi;
    scgi_temp_path {{.Dir}}/scgi;
`

// surrogateConf is a surrogate: nginx caching the origin's objects (which
// say no-store: the cache ignores that, as a CDN configured to cache them).
const surrogateConf = nginxHead + `    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 60s;
    keepalive_requests 100000;
    proxy_cache_path {{.Dir}}/cache levels=1:2 keys_zone=c:10m max_size=20g inactive=1h use_temp_path=off;
    upstream origin { server {{.Origin}}; keepalive 16; }
    server {
        listen {{.Listen}} backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache c;
            proxy_cache_key $request_uri;
            proxy_cache_valid 200 1h;
            proxy_ignore_headers Cache-Control Expires Set-Cookie;
            proxy_max_temp_file_size 0;
            proxy_cache_lock on;
            add_header X-Cache $upstream_cache_status;
        }
    }
}
`

// lbConf is nginx as an L7 load balancer on rr: consistent hashing of the
// URL over the surrogates (as the router does), keep-alive to them,
// unbuffered streaming.
const lbConf = nginxHead + `    tcp_nodelay on;
    keepalive_timeout 60s;
    keepalive_requests 100000;
    upstream surrogates {
        hash $request_uri consistent;
        server {{.S1}};
        server {{.S2}};
        keepalive 32;
    }
    server {
        listen {{.Listen}} backlog=4096;
        location / {
            proxy_pass http://surrogates;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_buffer_size 256k;
            proxy_buffers 4 256k;
            proxy_busy_buffers_size 256k;
        }
    }
}
`

type confData struct {
	Dir, Listen, Origin, S1, S2 string
}

// startNginx renders conf into dir and runs nginx in host's namespace.
func startNginx(ctx context.Context, w *emu.World, host, conf string, d confData) (*proc, error) {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return nil, err
	}
	t, err := template.New("nginx").Parse(conf)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(d.Dir, "nginx.conf")
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	err = t.Execute(f, d)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	cmd := w.Command(ctx, host, "nginx", "-c", path, "-g", "daemon off; user root root;")
	out, err := os.Create(filepath.Join(d.Dir, "stderr"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx on %s: %w", host, err)
	}
	return &proc{cmd: cmd, name: "nginx@" + host}, nil
}

// Geographic world (WonderProxy): clients in GeoClients, rr in London,
// surrogates s1 in Amsterdam and s2 in Chicago, origin in Washington;
// every pair's delay is half the embedded WonderProxy minimum RTT between
// their cities (emu derives the links). The router picks each client's
// nearest surrogate from the same matrix (--near ADDR/32@CITY).
var (
	GeoClients = []string{"Dublin", "Paris", "Warsaw", "NewYork", "Toronto", "Chicago"}
	geoSites   = map[string]string{"rr": "London", "s1": "Amsterdam", "s2": "Chicago", "origin": "Washington"}
)

// geoSpec is the geographic world; clients are c1..cN in GeoClients order.
func geoSpec(clients int) *emu.Spec {
	var hosts []emu.HostSpec
	for i := range clients {
		hosts = append(hosts, emu.HostSpec{Name: clientName(i + 1), Location: GeoClients[i]})
	}
	for _, h := range []string{"rr", "s1", "s2", "origin"} {
		hosts = append(hosts, emu.HostSpec{Name: h, Location: geoSites[h]})
	}
	return &emu.Spec{Name: "rtgeo", Dataset: "wonderproxy", Hosts: hosts}
}

// geoNearest is the surrogate nearest to client cK by the matrix.
func geoNearest(k int) string {
	m := topo.WonderProxy()
	c := m.Find(GeoClients[k-1])
	best, bestRTT := "s1", -1.0
	for _, s := range []string{"s1", "s2"} {
		if r := m.RTT[c][m.Find(geoSites[s])]; bestRTT < 0 || r < bestRTT {
			best, bestRTT = s, r
		}
	}
	return best
}
