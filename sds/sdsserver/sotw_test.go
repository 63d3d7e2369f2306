package sdsserver_test

import (
	"crypto/x509"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
)

const (
	dflt = secretcache.DefaultName
	root = secretcache.RootName
)

// forEachEnv runs test against a fake Source, a real Manager with an
// in-process signer, and end to end with the real CA server.
func forEachEnv(t *testing.T, test func(t *testing.T, e *env, h *harness)) {
	for _, mk := range []struct {
		name string
		env  func(*testing.T) *env
	}{{"fake", fakeEnv}, {"manager", managerEnv}, {"ca-server", caServerEnv}} {
		t.Run(mk.name, func(t *testing.T) {
			e := mk.env(t)
			test(t, e, start(t, e.src))
		})
	}
}

func TestStreamFirstFetch(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		c := newSotw(t, h.client, nil)
		c.request(dflt, root)
		got := c.recvNamed(dflt, root)
		chain, key := tlsCert(t, got[dflt])
		roots := trustedCA(t, got[root])
		verifySVID(t, chain, key, roots)
		if !roots[0].Equal(e.roots()[0]) {
			t.Error("ROOTCA is not the CA's root")
		}
		if got[root].GetValidationContext().GetCustomValidatorConfig() != nil {
			t.Error("ROOTCA in the SPIFFE validator form without asking")
		}
		h.wantMetric(t, 1, "meshid_agent_sds_streams")
	})
}

func TestStreamACKThenNoResend(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, publish := e.later(t)
		publish()
		c := newSotw(t, h.client, nil)
		c.request(dflt)
		first := c.recvSecret()
		v1 := c.version
		c.ack()
		// A request with the latest nonce that adds ROOTCA is handled
		// after the ACK: had the ACK caused a resend, default would come
		// before ROOTCA.
		c.request(dflt, root)
		c.wantSecret(root, "after the ACK")
		e.rotate(t)
		s := c.recvSecret()
		if s.GetName() != dflt || c.version == v1 {
			t.Fatalf("after rotation got %q version %s, want a new default (old %s)", s.GetName(), c.version, v1)
		}
		if serial(leafOf(t, s)) == serial(leafOf(t, first)) {
			t.Error("rotation pushed the same certificate")
		}
		// The same after a push.
		c.ack()
		c.request(dflt, root, later)
		c.wantSecret(later, "after the ACK of the push")
		// Each request after the first acknowledged the latest response.
		h.wantMetric(t, 4, "meshid_agent_sds_acks_total")
		h.wantMetric(t, 4, "meshid_agent_sds_pushes_total")
	})
}

func TestStreamNACK(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		c := h.withDefault(t)
		c.nack()
		// The NACK must not make the server send default again: the next
		// response is the ROOTCA asked for after it.
		c.request(dflt, root)
		c.wantSecret(root, "after the NACK")
		h.wantMetric(t, 1, "meshid_agent_sds_nacks_total")
		if n := h.logs.Count("SDS client rejected a response (NACK)"); n != 1 {
			t.Errorf("NACK logged %d times, want 1:\n%s", n, h.logs.All())
		}
		// A newer version is still sent.
		e.rotate(t)
		c.wantSecret(dflt, "after rotation")
	})
}

func TestStreamStaleNonceIgnored(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, publish := e.later(t)
		publish()
		c := h.withDefault(t)
		staleNonce := c.nonce
		e.rotate(t)
		c.recvSecret()
		// A request carrying the previous nonce is stale: its names
		// (adding ROOTCA) must be ignored.
		c.send(&discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{dflt, root}, ResponseNonce: staleNonce})
		c.request(dflt, later)
		c.wantSecret(later, "the stale request was not ignored")
		h.wantMetric(t, 1, "meshid_agent_sds_stale_requests_total")
	})
}

func TestStreamResourceNamesChange(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		c := h.withDefault(t)
		c.request(root) // drops default, adds ROOTCA
		c.wantSecret(root, "after changing the names")
		if n := e.watchers(dflt); n != 0 {
			t.Errorf("%d watches on default after unsubscribing", n)
		}
		// default changes, then ROOTCA: only ROOTCA may arrive.
		e.rotate(t)
		e.rootChange(t)
		s := c.recvSecret()
		if s.GetName() != root || !trustedCA(t, s)[0].Equal(e.roots()[0]) {
			t.Fatalf("got %q, want the new ROOTCA", s.GetName())
		}
		// An empty list unsubscribes everything; subscribing again sends
		// the current version again.
		c.request()
		c.request(dflt)
		c.wantSecret(dflt, "after unsubscribing and subscribing again")
		if n := e.watchers(root); n != 0 {
			t.Errorf("%d watches on ROOTCA after the empty list", n)
		}
	})
}

func TestStreamNameThatDoesNotExistYet(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, publish := e.later(t)
		c := newSotw(t, h.client, nil)
		c.request(later, dflt)
		c.wantSecret(dflt, "first (the other name does not exist yet)")
		c.ack()
		publish()
		c.wantSecret(later, "once it exists")
	})
}

func TestStreamUnknownName(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		c := newSotw(t, h.client, nil)
		c.request("no-such-secret", dflt)
		c.wantSecret(dflt, "with an unknown name asked too")
		h.logs.WaitFor(t, "SDS client asked for an unknown resource", 1)
		h.wantMetric(t, 1, "meshid_agent_sds_bad_requests_total", "reason", "unknown_resource")
		// The stream stays up.
		c.ack()
		e.rotate(t)
		c.wantSecret(dflt, "after a rotation, the stream still up")
	})
}

func TestStreamWrongTypeURL(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		c := newSotw(t, h.client, nil)
		c.send(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", ResourceNames: []string{dflt}})
		c.request(root)
		c.wantSecret(root, "the request of another type was not ignored")
		h.wantMetric(t, 1, "meshid_agent_sds_bad_requests_total", "reason", "type_url")
	})
}

func TestStreamPushReachesOnlySubscribers(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		a, b := newSotw(t, h.client, nil), newSotw(t, h.client, nil)
		r := newSotw(t, h.client, nil)
		for _, c := range []*sotwClient{a, b} {
			c.request(dflt)
			c.recvSecret()
			c.ack()
		}
		r.request(root)
		r.recvSecret()
		r.ack()
		e.rotate(t)
		sa, sb := a.recvSecret(), b.recvSecret()
		if sa.GetName() != dflt || sb.GetName() != dflt || a.version != b.version || serial(leafOf(t, sa)) != serial(leafOf(t, sb)) {
			t.Fatalf("the two streams got different pushes: %s %s", a.version, b.version)
		}
		// The ROOTCA-only stream saw nothing of the rotation: its next
		// message is the next ROOTCA.
		e.rootChange(t)
		r.wantSecret(root, "ROOTCA stream")
	})
}

func TestStreamSPIFFEValidator(t *testing.T) {
	tests := []struct {
		name   string
		value  *structpb.Value
		spiffe bool
	}{
		{"bool true", structpb.NewBoolValue(true), true},
		{"string true", structpb.NewStringValue("true"), true},
		{"bool false", structpb.NewBoolValue(false), false},
		{"other string", structpb.NewStringValue("yes please"), false},
	}
	e := fakeEnv(t)
	h := start(t, e.src)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newSotw(t, h.client, spiffeNode(tc.value))
			c.request(root, dflt)
			got := c.recvNamed(root, dflt)
			tlsCert(t, got[dflt]) // the certificate is unaffected
			if !tc.spiffe {
				trustedCA(t, got[root])
				return
			}
			checkSPIFFEValidator(t, got[root], e.roots())
		})
	}
}

func checkSPIFFEValidator(t *testing.T, s *tlsv3.Secret, roots []*x509.Certificate) {
	t.Helper()
	vc := s.GetValidationContext()
	if vc.GetTrustedCa() != nil {
		t.Error("SPIFFE validator form also sets trusted_ca")
	}
	cv := vc.GetCustomValidatorConfig()
	if cv.GetName() != sdsserver.SPIFFEValidatorName {
		t.Fatalf("custom validator %q, want %q", cv.GetName(), sdsserver.SPIFFEValidatorName)
	}
	cfg := &tlsv3.SPIFFECertValidatorConfig{}
	if err := cv.GetTypedConfig().UnmarshalTo(cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.GetTrustDomains()) != 1 || cfg.GetTrustDomains()[0].GetName() != "cluster.local" {
		t.Fatalf("trust domains %v, want cluster.local", cfg.GetTrustDomains())
	}
	bundle, err := certs.ParseCertificates(cfg.GetTrustDomains()[0].GetTrustBundle().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(bundle) != 1 || !bundle[0].Equal(roots[0]) {
		t.Error("trust bundle is not the root")
	}
}

func TestStreamNeverSendsExpiredCertificate(t *testing.T) {
	clk := clock.NewFake(time.Now())
	p := newPKI(t, clk)
	f := newFakeSource()
	f.set(p.certSecret(t, dflt, time.Hour))
	f.set(p.rootSecret(root))
	h := start(t, f, withClock(clk))

	c1 := newSotw(t, h.client, nil)
	c1.request(dflt)
	old := leafOf(t, c1.recvSecret())
	c1.ack()

	clk.Add(2 * time.Hour) // the cached default expired
	c2 := newSotw(t, h.client, nil)
	c2.request(dflt, root)
	c2.wantSecret(root, "an expired default must not be sent")
	f.set(p.certSecret(t, dflt, time.Hour))
	for _, c := range []*sotwClient{c2, c1} {
		s := c.recvSecret()
		if s.GetName() != dflt || serial(leafOf(t, s)) == serial(old) {
			t.Fatalf("got %q, want the new default", s.GetName())
		}
		if !clk.Now().Before(leafOf(t, s).NotAfter) {
			t.Fatal("sent an expired certificate")
		}
	}
}

func leafOf(t testing.TB, s *tlsv3.Secret) *x509.Certificate {
	t.Helper()
	chain, _ := tlsCert(t, s)
	return chain[0]
}
