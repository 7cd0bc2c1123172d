package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// DNSServer is the DNS-based redirection baseline: a small authoritative
// responder for one name that answers each query with the address of the
// surrogate nearest to the query's source (the client, or its resolver).
// Names outside the zone are refused; an AAAA or other type for the name
// gets an empty answer; a malformed query gets FORMERR (or is dropped when
// not even its header parses).
type DNSServer struct {
	name   dnsmessage.Name
	picker *Picker
	ttl    uint32
	log    *slog.Logger

	queries, answered counter
}

// NewDNSServer answers name (a domain, with or without the final dot) from
// picker's surrogates with ttl seconds.
func NewDNSServer(name string, ttl uint32, picker *Picker, log *slog.Logger) (*DNSServer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	n, err := dnsmessage.NewName(strings.ToLower(name))
	if err != nil || len(name) < 2 {
		return nil, fmt.Errorf("router: dns name %q: %v", name, err)
	}
	for _, s := range picker.Surrogates() {
		if _, err := surrogateIP(s); err != nil {
			return nil, err
		}
	}
	return &DNSServer{name: n, picker: picker, ttl: ttl, log: log}, nil
}

func surrogateIP(s Surrogate) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(s.Addr)
	if err != nil || !ap.Addr().Unmap().Is4() {
		return netip.Addr{}, fmt.Errorf("router: dns needs an IPv4 address:port for surrogate %q, not %q", s.Name, s.Addr)
	}
	return ap.Addr().Unmap(), nil
}

// Counts returns the queries received and answered with an address.
func (d *DNSServer) Counts() (queries, answered int64) { return d.queries.get(), d.answered.get() }

// Serve answers queries on pc until ctx ends; it closes pc.
func (d *DNSServer) Serve(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("router: dns read: %w", err)
		}
		d.queries.add(1)
		var client netip.Addr
		if ua, ok := from.(*net.UDPAddr); ok {
			client = ua.AddrPort().Addr().Unmap()
		}
		resp := d.Answer(buf[:n], client)
		if resp == nil {
			continue
		}
		if _, err := pc.WriteTo(resp, from); err != nil {
			d.log.Debug("dns write", "to", from, "err", err)
		}
	}
}

// Answer returns the response to query from client, or nil to drop it.
func (d *DNSServer) Answer(query []byte, client netip.Addr) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 || h.OpCode != 0 {
		rh.RCode = dnsmessage.RCodeFormatError
		if h.OpCode != 0 {
			rh.RCode = dnsmessage.RCodeNotImplemented
		}
		return build(rh, nil, nil, 0)
	}
	q := qs[0]
	if !strings.EqualFold(q.Name.String(), d.name.String()) || q.Class != dnsmessage.ClassINET {
		rh.RCode = dnsmessage.RCodeRefused
		return build(rh, &q, nil, 0)
	}
	rh.Authoritative = true
	if q.Type != dnsmessage.TypeA {
		return build(rh, &q, nil, 0)
	}
	ip, _ := surrogateIP(d.picker.Nearest(client))
	d.answered.add(1)
	return build(rh, &q, &dnsmessage.AResource{A: ip.As4()}, d.ttl)
}

func build(h dnsmessage.Header, q *dnsmessage.Question, a *dnsmessage.AResource, ttl uint32) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if q != nil {
		if b.StartQuestions() != nil || b.Question(*q) != nil {
			return nil
		}
	}
	if a != nil && q != nil {
		if b.StartAnswers() != nil {
			return nil
		}
		if b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}, *a) != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
