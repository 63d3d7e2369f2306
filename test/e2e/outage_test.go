package e2e_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/clock"
)

// delivery is one default secret pushed on a stream, with the fake time it
// arrived at.
type delivery struct {
	leaf *x509.Certificate
	at   time.Time
	err  error
}

// forward receives the stream's further responses in the background, ACKs
// them, and sends each default secret to the returned channel. It stops
// when the stream ends.
func (s *sotw) forward(clk *clock.Fake) <-chan delivery {
	out := make(chan delivery, 16)
	go func() {
		defer close(out)
		for {
			r, err := s.s.Recv()
			if err != nil {
				return
			}
			at := clk.Now()
			for _, a := range r.GetResources() {
				sec := &tlsv3.Secret{}
				if err := a.UnmarshalTo(sec); err != nil {
					out <- delivery{at: at, err: err}
					continue
				}
				if sec.GetName() != "default" {
					continue
				}
				tc := sec.GetTlsCertificate()
				svid, err := x509svid.Parse(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
				if err != nil {
					out <- delivery{at: at, err: err}
					continue
				}
				out <- delivery{leaf: svid.Certificates[0], at: at}
			}
			if err := s.s.Send(&discoveryv3.DiscoveryRequest{
				TypeUrl: secretTypeURL, ResourceNames: s.names, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce(),
			}); err != nil {
				return
			}
		}
	}()
	return out
}

// fetchDefault fetches default with FetchSecrets.
func fetchDefault(t *testing.T, a *agentProc) (*x509.Certificate, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	r, err := a.sds.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{TypeUrl: secretTypeURL, ResourceNames: []string{"default"}})
	if err != nil {
		return nil, err
	}
	if len(r.GetResources()) != 1 {
		t.Fatalf("fetch returned %d resources", len(r.GetResources()))
	}
	sec := &tlsv3.Secret{}
	if err := r.GetResources()[0].UnmarshalTo(sec); err != nil {
		t.Fatal(err)
	}
	return svidOf(t, sec).Certificates[0], nil
}

// waitCounter polls a counter of the agent until it reaches want.
func waitCounter(t *testing.T, a *agentProc, name string, want float64) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(guard)
	defer deadline.Stop()
	for {
		got := counter(t, a.reg, name)
		if got >= want {
			if got > want {
				t.Fatalf("%s = %v, want %v", name, got, want)
			}
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s stayed at %v, want %v", name, got, want)
		}
	}
}

// Issue 3: with the CA stopped, the cached certificate is still served, the
// failures are counted, no expired certificate is ever served, and the agent
// recovers by itself when the CA restarts on the same address.
func TestCAOutage(t *testing.T) {
	const (
		failures  = "meshid_agent_rotation_failures_total"
		rotations = "meshid_agent_rotations_total"
	)
	w := newWorld(t, true)
	ca := w.startCA(t, "127.0.0.1:0")
	a := w.startAgent(t, ca.addr, "shop", "cart", time.Hour)

	watcher := openSotw(t, a.sds, "default", "ROOTCA")
	got := watcher.recvNames("default", "ROOTCA")
	bundle := bundleOf(t, got["ROOTCA"])
	v1 := svidOf(t, got["default"]).Certificates[0]
	pushes := watcher.forward(w.fake)

	ca.stop()

	// A new stream and a fetch are served from the cache.
	again := openSotw(t, a.sds, "default").recvNames("default")
	if c := svidOf(t, again["default"]).Certificates[0]; !c.Equal(v1) {
		t.Fatal("a new stream was not served the cached certificate")
	}

	// The renewal fails, and so do the retries, each one counted; the
	// cached certificate is served meanwhile.
	const retries = 4
	for i := 1; i <= 1+retries; i++ {
		before := w.fake.Now()
		at := parked(t, w.fake)
		if i > 1 && at.Sub(before) > time.Minute {
			t.Fatalf("retry %d after %v: the backoff is capped at a minute", i-1, at.Sub(before))
		}
		w.fake.Set(at)
		waitCounter(t, a, failures, float64(i))
		c, err := fetchDefault(t, a)
		if err != nil || !c.Equal(v1) {
			t.Fatalf("while the CA is down and the certificate valid, fetch: %v", err)
		}
		if !w.fake.Now().Before(v1.NotAfter) {
			t.Fatal("the test walked past NotAfter too early")
		}
	}

	// Past NotAfter, the expired certificate is served to nobody.
	parked(t, w.fake)
	w.fake.Set(v1.NotAfter)
	waitCounter(t, a, failures, 2+retries)
	if _, err := fetchDefault(t, a); status.Code(err) != codes.Unavailable {
		t.Fatalf("fetch after expiry: %v, want Unavailable", err)
	}
	if err := a.manager.Ready(); err == nil {
		t.Fatal("the agent reports ready with an expired certificate")
	}
	late := openSotw(t, a.sds, "default", "ROOTCA")
	if first := late.recv(); len(first) != 1 || first[0].GetName() != "ROOTCA" {
		t.Fatalf("a stream opened after expiry got %d secrets (%q), want only ROOTCA", len(first), secretNames(first))
	}
	latePushes := late.forward(w.fake)

	// The CA comes back on the same address. Walk the clock through the
	// agent's backoff (a retry may still find the connection down) until it
	// pushes a new certificate by itself.
	w.startCA(t, ca.addr)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(guard)
	defer deadline.Stop()
	var v2 delivery
	for v2.leaf == nil {
		select {
		case d, ok := <-pushes:
			if !ok {
				t.Fatal("the stream ended")
			}
			v2 = d
		case <-tick.C:
			// Advance only through retries: once the new certificate
			// is in (counted before its renewal timer is set), the
			// next timer is its renewal.
			if counter(t, a.reg, rotations) < 2 && w.fake.Waiters() > 0 {
				if at, ok := w.fake.NextDeadline(); ok {
					w.fake.Set(at)
				}
			}
		case <-deadline.C:
			t.Fatalf("no new certificate within %v of the CA's restart (%v CA failures)", guard, counter(t, a.reg, failures))
		}
		if v2.err != nil {
			t.Fatal(v2.err)
		}
	}
	if v2.leaf.Equal(v1) || !v2.at.Before(v2.leaf.NotAfter) {
		t.Fatalf("after recovery the stream got serial %x (old %x) valid until %v at %v", v2.leaf.SerialNumber, v1.SerialNumber, v2.leaf.NotAfter, v2.at)
	}
	if _, _, err := x509svid.Verify([]*x509.Certificate{v2.leaf}, bundle, x509svid.WithTime(v2.at)); err != nil {
		t.Fatalf("the new certificate does not verify: %v", err)
	}
	select {
	case d := <-latePushes:
		if d.err != nil || !d.leaf.Equal(v2.leaf) {
			t.Fatalf("the stream waiting since the expiry got %v / %v, want the new certificate", d.err, d.leaf)
		}
	case <-deadline.C:
		t.Fatal("the stream waiting since the expiry got no certificate")
	}
	if c, err := fetchDefault(t, a); err != nil || !c.Equal(v2.leaf) {
		t.Fatalf("fetch after recovery: %v", err)
	}
	if err := a.manager.Ready(); err != nil {
		t.Fatalf("not ready after recovery: %v", err)
	}
	if n := counter(t, a.reg, rotations); n != 2 {
		t.Fatalf("meshid_agent_rotations_total = %v, want 2", n)
	}
}
