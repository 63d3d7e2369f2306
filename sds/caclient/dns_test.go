package caclient_test

import (
	"context"
	"crypto/x509"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/meshid/meshid/sds/caclient"
)

// dnsServer is a DNS server on 127.0.0.1 (UDP) that answers A questions for
// one name with 127.0.0.1, everything else with an empty answer or NXDOMAIN,
// and records every question it was asked.
type dnsServer struct {
	name string // fully qualified, e.g. "ca.meshid.test."
	conn net.PacketConn

	mu        sync.Mutex
	questions []dnsmessage.Question
}

func startDNS(t *testing.T, name string) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{name: name, conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if out, ok := s.answer(buf[:n]); ok {
				_, _ = conn.WriteTo(out, from)
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return s
}

func (s *dnsServer) answer(in []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(in)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	s.mu.Lock()
	s.questions = append(s.questions, q)
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	known := q.Name.String() == s.name
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && q.Type == dnsmessage.TypeA {
		err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30}, dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}})
		if err != nil {
			return nil, false
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

func (s *dnsServer) asked() []dnsmessage.Question {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]dnsmessage.Question(nil), s.questions...)
}

// The agent resolves the CA's name for addresses only: it never asks DNS for
// gRPC service config (a TXT record, _grpc_config.<name>). With that lookup
// on, an agent whose DNS server does not answer (a pod network without a
// route to it, an overloaded cluster DNS at a node's restart) waited out the
// resolver's timeouts, 10 s, before its first CSR; the real node showed it
// (docs/benchmarks.md). Whoever answers the record could also rewrite the
// connection's policy.
func TestNoServiceConfigFromDNS(t *testing.T) {
	ca := startCA(t, istiodOnly, nil)
	_, port, _ := net.SplitHostPort(ca.addr)
	dns := startDNS(t, "ca.meshid.test.")
	c := newClient(t, caclient.Config{
		// gRPC's DNS resolver, asking this test's server.
		Addr:       "dns://" + dns.conn.LocalAddr().String() + "/ca.meshid.test:" + port,
		ServerName: istiodOnly[0],
		Roots:      []*x509.Certificate{ca.h.root},
		TokenFile:  ca.clientConfig(t).TokenFile,
	})
	_, csr := newCSR(t, workload)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := c.Sign(ctx, csr, time.Hour); err != nil {
		t.Fatal(err)
	}
	asked := dns.asked()
	sawA := false
	for _, q := range asked {
		switch q.Type {
		case dnsmessage.TypeA:
			sawA = sawA || q.Name.String() == "ca.meshid.test."
		case dnsmessage.TypeAAAA:
		default:
			t.Errorf("the agent asked DNS for %v %s; it needs addresses only", q.Type, q.Name)
		}
	}
	if !sawA {
		// Without this the test would pass had the address come from
		// anywhere but this server.
		t.Fatalf("the CA's name was not resolved through the test's DNS server (questions %v)", asked)
	}
}
