package caserver_test

import (
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/testkit"
)

// TestUpstreamStepCA (issue 32): a CA with no intermediate mints one from
// the real step-ca through its JWK provisioner and intermediate template:
// it signs leaves that chain through step-ca's intermediate to step-ca's
// root, which an agent serves and which is the published bundle. Each
// renewal brings a new key; with step-ca stopped the CA keeps signing
// and says why the renewal failed; when step-ca returns the renewal
// succeeds.
func TestUpstreamStepCA(t *testing.T) {
	// step-ca signs on the real clock while the CA's fake clock runs
	// ahead by the renewals and the outage: 8h leaves room for three
	// renewals and an outage before an answer is shorter than the
	// renewal period (2h).
	s := testkit.StartStepCA(t, 8*time.Hour, "example.org")
	w := newUpstreamWorldWith(t, s.Root,
		"step+https://"+s.Addr+"?provisioner="+testkit.StepProvisionerCA+"&ca="+s.RootFile, s.KeyFile, 8*time.Hour)
	first := w.s.Authority().Bundle()
	if len(first.Roots) != 1 || !first.Roots[0].Equal(s.Root) || len(first.Intermediates) != 1 ||
		!first.Intermediates[0].Equal(s.Intermediate) || first.Cert.CheckSignatureFrom(s.Intermediate) != nil {
		t.Fatal("the CA does not sign with an intermediate of step-ca's intermediate, trusting step-ca's root only")
	}
	if got := testkit.ReadCerts(t, filepath.Join(w.dir, "root-cert.pem")); len(got) != 1 || !got[0].Equal(s.Root) {
		t.Fatal("root-cert.pem is not step-ca's root")
	}
	if chain := w.leaf(t, "a"); len(chain) != 3 || !chain[1].Equal(first.Cert) || !chain[2].Equal(s.Intermediate) {
		t.Fatalf("the agent serves %d certificates, want the leaf, the minted intermediate and step-ca's", len(chain))
	}

	// Two renewals, each at a quarter of the life from the last mint: a
	// new key each time, through the rotation.
	seen := []*x509.Certificate{first.Cert}
	for i := range 2 {
		cur := w.s.Authority().Bundle()
		w.fake.Set(w.fake.Now().Add(cur.Cert.NotAfter.Sub(w.fake.Now()) / 4))
		// Until the renewer has logged the new intermediate: it reads the
		// clock (the next renewal's origin) after the rotation took it.
		advanceUntil(t, w, time.Minute, "renewal", func() bool {
			return w.logs.CountContaining("new intermediate minted by the upstream") == i+1
		})
		if w.s.Authority().Bundle().Cert.Equal(cur.Cert) {
			t.Fatalf("renewal %d did not reach the authority", i+1)
		}
		next := w.s.Authority().Bundle()
		for _, old := range seen {
			if certs.KeyMatches(old.PublicKey, next.Key) {
				t.Fatalf("renewal %d kept an earlier key", i+1)
			}
		}
		seen = append(seen, next.Cert)
		if chain := w.sign(t, "b"); !chain[1].Equal(next.Cert) || !chain[2].Equal(s.Intermediate) {
			t.Fatalf("after renewal %d leaves are not signed by the new intermediate under step-ca's", i+1)
		}
	}
	if n := testkit.Metric(t, w.reg, "meshid_ca_rotation_steps_total", "step", "switched"); n != 2 {
		t.Fatalf("rotation switched %v times, want 2", n)
	}

	current := w.s.Authority().Bundle().Cert
	s.Stop()
	advanceUntil(t, w, 5*time.Minute, "a failed renewal", func() bool {
		return w.logs.CountContaining("did not renew") > 0
	})
	if !strings.Contains(w.logs.All(), "step-ca roots") {
		t.Fatalf("the log does not say which request to step-ca failed:\n%s", w.logs.All())
	}
	if n := testkit.Metric(t, w.reg, "meshid_ca_upstream_consecutive_failures"); n < 1 {
		t.Fatalf("consecutive failures %v with step-ca down", n)
	}
	if chain := w.sign(t, "c"); !chain[1].Equal(current) {
		t.Fatal("the CA did not keep signing with the current intermediate")
	}

	s.Start(t)
	advanceUntil(t, w, time.Minute, "renewal once step-ca is back", func() bool {
		return w.logs.CountContaining("new intermediate minted by the upstream") == 3
	})
	if w.s.Authority().Bundle().Cert.Equal(current) {
		t.Fatal("the renewal after the outage did not reach the authority")
	}
	if n := testkit.Metric(t, w.reg, "meshid_ca_upstream_consecutive_failures"); n != 0 {
		t.Fatalf("consecutive failures %v after a success", n)
	}
}
