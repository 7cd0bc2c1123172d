package mget

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mosto-net/mosto/internal/origin"
	"github.com/mosto-net/mosto/internal/testenv"
)

// startNginx serves dir with a real nginx on a free loopback port; without
// nginx it skips the test (fails it under MOSTO_REQUIRE_PRIV=1).
func startNginx(t *testing.T, dir string) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, err2 := os.Stat("/usr/sbin/nginx"); err2 != nil {
			testenv.Unmet(t, "nginx not installed (.ci/run installs it)")
		}
		bin = "/usr/sbin/nginx"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	work := t.TempDir()
	os.MkdirAll(filepath.Join(work, "tmp"), 0o755)
	user := ""
	if os.Geteuid() == 0 {
		user = "user root root;\n"
	}
	conf := fmt.Sprintf(`%sworker_processes 1;
error_log %s/error.log warn;
pid %s/nginx.pid;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %s/tmp/body;
    proxy_temp_path %s/tmp/proxy;
    fastcgi_temp_path %s/tmp/fastcgi;
    uwsgi_temp_path %s/tmp/uwsgi;
    scgi_temp_path %s/tmp/scgi;
    limit_rate 2m;
    server { listen %s; root %s; }
}
`, user, work, work, work, work, work, work, work, addr, dir)
	cp := filepath.Join(work, "nginx.conf")
	if err := os.WriteFile(cp, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", work, "-c", cp, "-e", filepath.Join(work, "error.log"), "-g", "daemon off; master_process on;")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(work, "error.log"))
			t.Fatalf("nginx does not accept on %s: %v\n%s", addr, err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGetFromNginx downloads from two real nginx mirrors of one file (same
// bytes and mtime: same ETag) and refuses a third whose copy has another
// mtime (another ETag), as mirrors of a changed object.
func TestGetFromNginx(t *testing.T) {
	const size = 3<<20 + 12345
	body, _ := io.ReadAll(origin.Body(77, size))
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	var urls []string
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		p := filepath.Join(dir, "obj.bin")
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
		m := mtime
		if i == 2 {
			m = m.Add(time.Hour)
		}
		os.Chtimes(p, m, m)
		urls = append(urls, startNginx(t, dir)+"/obj.bin")
	}
	out := filepath.Join(t.TempDir(), "f")
	sum := sha256.Sum256(body)
	st, err := Get(context.Background(), Config{Sources: sources(urls...), Out: out, Block: 64 << 10, SHA256: sum[:]})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, out, size)
	if st.Subflows[0].Bytes == 0 || st.Subflows[1].Bytes == 0 {
		t.Errorf("a matching nginx mirror carried nothing: %+v", st.Subflows)
	}
	if !strings.Contains(st.Subflows[2].Disabled, "ETag") || st.Subflows[2].Bytes != 0 {
		t.Errorf("nginx mirror with another mtime not refused on its ETag: %+v", st.Subflows[2])
	}
}
