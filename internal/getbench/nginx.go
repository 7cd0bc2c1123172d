package getbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/mosto-net/mosto/internal/mget"
	"github.com/mosto-net/mosto/internal/origin"
)

const portNginx = 8081

// nginxConf is the mirrors' nginx configuration, tuned for serving large
// static files to few clients: sendfile in 512 KiB chunks with
// tcp_nopush, long keep-alive (aria2c and mosto get reuse connections
// for many ranges), no access log, one worker (each mirror is one
// emulated host).
const nginxConf = `%sworker_processes 1;
error_log %s/error.log warn;
pid %s/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    sendfile_max_chunk 512k;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    client_body_temp_path %s/tmp/body;
    proxy_temp_path %s/tmp/proxy;
    fastcgi_temp_path %s/tmp/fastcgi;
    uwsgi_temp_path %s/tmp/uwsgi;
    scgi_temp_path %s/tmp/scgi;
    server { listen %s; root %s; }
}
`

// startNginx writes the objects of the given sizes (seed 3, one mtime:
// every mirror has the same ETag) and runs nginx in each source's
// namespace on portNginx; stop kills them.
func (b *bench) startNginx(ctx context.Context, sizes ...int64) (stop func(), err error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			return nil, fmt.Errorf("getbench: nginx not installed: %w", err)
		}
		bin = "/usr/sbin/nginx"
	}
	www := filepath.Join(b.cfg.Dir, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		return nil, err
	}
	mtime := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	for _, size := range sizes {
		p := filepath.Join(www, fmt.Sprintf("obj-%d", size))
		f, err := os.Create(p)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(f, origin.Body(3, size))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			return nil, err
		}
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			c.Wait()
		}
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root root;\n"
	}
	for _, s := range sources {
		work := filepath.Join(b.cfg.Dir, "nginx-"+s.host)
		if err := os.MkdirAll(filepath.Join(work, "tmp"), 0o755); err != nil {
			stop()
			return nil, err
		}
		conf := fmt.Sprintf(nginxConf, user, work, work, work, work, work, work, work, b.addr(s.host, portNginx), www)
		cp := filepath.Join(work, "nginx.conf")
		if err := os.WriteFile(cp, []byte(conf), 0o644); err != nil {
			stop()
			return nil, err
		}
		cmd := b.w.Command(context.Background(), s.host, bin, "-p", work, "-c", cp, "-e", filepath.Join(work, "error.log"), "-g", "daemon off; master_process on;")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("getbench: nginx in %s: %w", s.host, err)
		}
		cmds = append(cmds, cmd)
	}
	for _, s := range sources {
		deadline := time.Now().Add(15 * time.Second)
		for {
			c, err := b.w.Dial(ctx, client, "tcp", b.addr(s.host, portNginx))
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				stop()
				log, _ := os.ReadFile(filepath.Join(b.cfg.Dir, "nginx-"+s.host, "error.log"))
				return nil, errors.Join(fmt.Errorf("getbench: nginx in %s does not accept: %w", s.host, err), errors.New(string(log)))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return stop, nil
}

func (b *bench) nginxURL(host string, size int64) string {
	return fmt.Sprintf("http://%s/obj-%d", b.addr(host, portNginx), size)
}

// nginx: the multisource scenario with nginx mirrors (12 MB): Paris alone
// (mosto get), all three (mosto get, aria2c), curl from Paris.
func (b *bench) nginx(ctx context.Context) error {
	const size = 12_000_000
	stop, err := b.startNginx(ctx, size)
	if err != nil {
		return err
	}
	defer stop()
	var urls []string
	var srcs []mget.Source
	for _, s := range sources {
		urls = append(urls, b.nginxURL(s.host, size))
		srcs = append(srcs, mget.Source{URL: b.nginxURL(s.host, size), Dial: b.dial})
	}
	for run := 0; run < b.cfg.Runs[0]; run++ {
		el, st, err := b.getMosto(ctx, srcs[1:2], size, nil)
		b.record(result("nginx", "single Paris", run, el, st, err))
		el, st, err = b.getMosto(ctx, srcs, size, nil)
		b.record(result("nginx", "mosto get", run, el, st, err))
		el, err = b.aria2(ctx, size, nil, urls...)
		b.record(result("nginx", "aria2c", run, el, nil, err))
		el, err = b.runTool(ctx, size, nil, "curl", "-s", "-S", "-f", urls[1])
		b.record(result("nginx", "curl Paris", run, el, nil, err))
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}
