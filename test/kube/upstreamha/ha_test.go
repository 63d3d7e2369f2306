package upstreamha_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"maps"
	"math/big"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/ca/upstream/cfssl"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// refusedLog is the line a replica logs for a Secret it refuses.
const refusedLog = "the upstream intermediate in the Secret is refused"

// world is the real cfssl upstream and the fake clock the replicas share
// (it starts at the real time; cfssl is told to date what it signs at
// the fake time before each renewal, testkit.CFSSL.SetClock).
type world struct {
	up    *testkit.CFSSL
	roots []*x509.Certificate // every root cfssl has signed under
	url   *upstream.URL
	fake  *clock.Fake
	td    spiffeid.TrustDomain
}

// replica is one `meshid server --upstream … --kube-ca-secret`.
type replica struct {
	name string
	s    *caserver.Server
	reg  *prometheus.Registry
	logs *testkit.LogRecorder
	stop func()
}

func newWorld(t *testing.T) *world {
	t.Helper()
	up := testkit.StartCFSSL(t, 2*time.Hour)
	u, err := upstream.ParseURL("cfssl+https://" + up.Addr + "?profile=" + testkit.CFSSLProfileCA + "&ca=" + up.TLSCAFile)
	if err != nil {
		t.Fatal(err)
	}
	return &world{up: up, roots: []*x509.Certificate{up.Root}, url: u, fake: clock.NewFake(time.Now()), td: spiffeid.RequireTrustDomainFromString("example.org")}
}

// start runs a replica named name (its pod name: the Lease's identity)
// as the CA's ServiceAccount, asking for 2h intermediates renewed at a
// quarter of their life.
func (w *world) start(t *testing.T, name string) *replica {
	t.Helper()
	r := &replica{name: name, reg: prometheus.NewRegistry(), logs: testkit.NewLogRecorder()}
	s, err := caserver.New(caserver.Config{
		TrustDomain:  w.td,
		Kube:         caserver.KubeConfig{Kubeconfig: caKubeconfig, Namespace: caNamespace, PodName: name, DisableRootConfigMap: true},
		KubeCASecret: true,
		Authn:        caserver.AuthnConfig{TokenVerification: boundtoken.ModeTokenReview},
		Listen:       "127.0.0.1:0",
		StateDir:     t.TempDir(),
		Upstream:     caserver.UpstreamConfig{URL: w.url, CredentialsFile: w.up.KeyFile, Lifetime: 2 * time.Hour, RenewAt: 0.25},
		Clock:        w.fake,
		Logger:       r.logs.Logger(),
		Registerer:   r.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	r.s, r.stop = s, testkit.Start(t, name, s.Run)
	t.Cleanup(r.stop)
	return r
}

// mints is the replica's meshid_ca_upstream_mints_total{result}.
func (r *replica) mints(t *testing.T, result string) float64 {
	t.Helper()
	v, _ := testkit.LookupMetric(t, r.reg, "meshid_ca_upstream_mints_total", "result", result)
	return v
}

func totalMints(t *testing.T, rs []*replica, result string) float64 {
	t.Helper()
	n := 0.0
	for _, r := range rs {
		n += r.mints(t, result)
	}
	return n
}

// signing is the intermediate the replica signs with, nil before it serves.
func (r *replica) signing() *x509.Certificate {
	if a := r.s.Authority(); a != nil {
		return a.Bundle().Cert
	}
	return nil
}

// sign has the replica sign a leaf, checks that it chains to the cfssl
// root at the fake time, and returns the intermediate that signed it.
func (w *world) sign(t *testing.T, r *replica) *x509.Certificate {
	t.Helper()
	id := spiffeid.RequireFromPath(w.td, "/ns/ns1/sa/a")
	csr, err := ca.VerifyCSR(testkit.CSR(t, testkit.Key(t, certs.ECP256), id))
	if err != nil {
		t.Fatal(err)
	}
	iss, err := r.s.Authority().Sign(context.Background(), ca.Request{CSR: csr, ID: id, Caller: "test"})
	if err != nil {
		t.Fatalf("%s does not sign: %v", r.name, err)
	}
	if _, err := certs.VerifySVID(append([]*x509.Certificate{iss.Leaf}, iss.Chain...), w.td, w.roots, w.fake.Now()); err != nil {
		t.Fatalf("%s: the leaf does not chain to a cfssl root: %v", r.name, err)
	}
	return iss.Chain[0]
}

// eventually polls cond on the real clock (the API server and the
// election run on it) until it holds, for at most a minute.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-time.After(100 * time.Millisecond): // a poll of the real cluster, not a timed assertion
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

// leader is the replica holding the Lease meshid-ca.
func leader(t *testing.T, rs ...*replica) (*replica, *replica) {
	t.Helper()
	var lead, other *replica
	eventually(t, "a replica holds the Lease", func() error {
		l, err := cluster.Client().CoordinationV1().Leases(caNamespace).Get(t.Context(), "meshid-ca", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i, r := range rs {
			if h := l.Spec.HolderIdentity; h != nil && *h == r.name {
				lead, other = r, rs[1-i]
				return nil
			}
		}
		return fmt.Errorf("holder %v", l.Spec.HolderIdentity)
	})
	return lead, other
}

// mintAt moves the fake clock to the leader's renewal point, cfssl
// dating what it signs at it.
func (w *world) mintAt(t *testing.T, lead *replica) {
	t.Helper()
	st, ok := lead.s.UpstreamStatus()
	if !ok {
		t.Fatal("no upstream status")
	}
	w.up.SetClock(t, st.RenewAt)
	w.fake.Set(st.RenewAt)
}

// renew mints at the leader's renewal point and steps the fake clock
// until every replica signs under a new intermediate, the same one
// (switched at once, or activated after the propagation); it returns it.
func (w *world) renew(t *testing.T, lead *replica, rs []*replica, prev *x509.Certificate) *x509.Certificate {
	t.Helper()
	w.mintAt(t, lead)
	return w.stepUntilSwitched(t, lead, rs, prev)
}

func (w *world) stepUntilSwitched(t *testing.T, lead *replica, rs []*replica, prev *x509.Certificate) *x509.Certificate {
	t.Helper()
	for range 40 {
		next := rs[0].signing()
		same := !next.Equal(prev)
		for _, r := range rs[1:] {
			same = same && r.signing().Equal(next)
		}
		if same {
			for _, r := range rs {
				if got := w.sign(t, r); !got.Equal(next) {
					t.Fatalf("%s signs under %s, not the new intermediate", r.name, got.SerialNumber.Text(16))
				}
			}
			return next
		}
		w.fake.Add(time.Minute)
		<-time.After(250 * time.Millisecond) // real time for the woken loops and the watch to act; not a timed assertion
	}
	t.Fatalf("the replicas did not all switch to a new intermediate; leader logs:\n%s", lead.logs.All())
	return nil
}

func secretData(t *testing.T) map[string][]byte {
	t.Helper()
	sec, err := cluster.Client().CoreV1().Secrets(caNamespace).Get(t.Context(), caserver.UpstreamSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sec.Data
}

func writeSecret(t *testing.T, data map[string][]byte) {
	t.Helper()
	secrets := cluster.Client().CoreV1().Secrets(caNamespace)
	sec, err := secrets.Get(t.Context(), caserver.UpstreamSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data = data
	if _, err := secrets.Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// resetCluster deletes what an earlier test left: the Secrets and Lease.
func resetCluster(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	for _, name := range []string{caserver.UpstreamSecret, caserver.RotationStateSecret} {
		_ = cluster.Client().CoreV1().Secrets(caNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	}
	_ = cluster.Client().CoordinationV1().Leases(caNamespace).Delete(ctx, "meshid-ca", metav1.DeleteOptions{})
}

// TestUpstreamHAOneMintPerRenewal (issue 32, HA): two replicas against
// one real cfssl. At start exactly one mint across both (the elected
// one's), and both sign under that intermediate; at each of two renewal
// points one more mint, and both sign under the same new intermediate (a
// new key each time); the follower never mints. Secrets edited to hold
// an intermediate of another CA, one that is not for its key, an expired
// one from the upstream itself, a leaf of the upstream, or a huge value:
// refused by every replica with a log line and meshid_ca_rotation_stuck,
// nothing changes and nothing is minted; the good Secret back clears the
// stuck state. The leader stopped: the other takes the Lease, finds the
// Secret's intermediate and mints nothing until its renewal point, then
// exactly once; a replacement replica loads the Secret and never mints.
// Then cfssl's root is replaced: the next intermediate is prepared on
// both replicas (the new root trusted, the current intermediate
// signing), both activate it at the leader's time, and it is one mint
// more.
func TestUpstreamHAOneMintPerRenewal(t *testing.T) {
	resetCluster(t)
	w := newWorld(t)
	a, b := w.start(t, "meshid-up-a"), w.start(t, "meshid-up-b")
	all := []*replica{a, b}

	eventually(t, "both replicas sign under one intermediate", func() error {
		ca, cb := a.signing(), b.signing()
		if ca == nil || cb == nil || !ca.Equal(cb) {
			return fmt.Errorf("a signs under %v, b under %v", ca != nil, cb != nil)
		}
		return nil
	})
	first := a.signing()
	if first.CheckSignatureFrom(w.up.Root) != nil {
		t.Fatal("the intermediate is not the cfssl root's")
	}
	for _, r := range all {
		if got := w.sign(t, r); !got.Equal(first) {
			t.Fatalf("%s signs under another intermediate", r.name)
		}
	}
	if n := totalMints(t, all, "ok"); n != 1 {
		t.Fatalf("%v mints at start across the replicas, want 1", n)
	}
	lead, follower := leader(t, a, b)
	if lead.mints(t, "ok") != 1 {
		t.Fatalf("the leader %s did not mint; the follower did", lead.name)
	}
	good := secretData(t)
	if len(good[keystore.CAKeyFile]) == 0 || len(good[keystore.RootCertFile]) == 0 {
		t.Fatalf("the Secret lacks the key or the roots: %v", slicesKeys(good))
	}

	// Two renewals: one mint each, by the leader.
	prev := first
	for i := 1; i <= 2; i++ {
		next := w.renew(t, lead, all, prev)
		if certs.KeyMatches(prev.PublicKey, lead.s.Authority().Bundle().Key) {
			t.Fatalf("renewal %d kept the key", i)
		}
		if n := totalMints(t, all, "ok"); n != float64(1+i) {
			t.Fatalf("after renewal %d: %v mints across the replicas, want %d", i, n, 1+i)
		}
		if n := follower.mints(t, "ok") + follower.mints(t, "failed") + follower.mints(t, "refused"); n != 0 {
			t.Fatalf("the follower called the upstream %v times", n)
		}
		prev = next
	}
	good = secretData(t)

	// Edited Secrets: refused, nothing changes.
	for _, c := range badSecrets(t, w, good) {
		before := map[string]int{}
		for _, r := range all {
			before[r.name] = r.logs.CountContaining(refusedLog)
		}
		writeSecret(t, c.data)
		for _, r := range all {
			r.logs.WaitForContaining(t, refusedLog, before[r.name]+1)
			if line := lastContaining(r.logs, refusedLog); !strings.Contains(line, c.want) {
				t.Fatalf("%s: %s: the refusal does not say %q: %s", c.name, r.name, c.want, line)
			} else {
				t.Logf("%s: %s: %s", c.name, r.name, line)
			}
			if !r.signing().Equal(prev) || !w.sign(t, r).Equal(prev) {
				t.Fatalf("%s: %s switched", c.name, r.name)
			}
			if v := testkit.Metric(t, r.reg, "meshid_ca_rotation_stuck"); v != 1 {
				t.Fatalf("%s: %s: meshid_ca_rotation_stuck %v, want 1", c.name, r.name, v)
			}
		}
		if n := totalMints(t, all, "ok"); n != 3 {
			t.Fatalf("%s: %v mints, want 3", c.name, n)
		}
	}
	writeSecret(t, good)
	eventually(t, "the good Secret back: no replica stuck", func() error {
		for _, r := range all {
			if v := testkit.Metric(t, r.reg, "meshid_ca_rotation_stuck"); v != 0 {
				return fmt.Errorf("%s: meshid_ca_rotation_stuck %v", r.name, v)
			}
		}
		return nil
	})

	// Failover: the follower leads, mints nothing until its renewal point.
	lead.stop()
	eventually(t, "the follower takes the Lease", func() error {
		if l, _ := leader(t, follower, lead); l != follower {
			return fmt.Errorf("%s still leads", l.name)
		}
		return nil
	})
	follower.logs.WaitForContaining(t, "leading: the upstream intermediate is renewed by this replica", 1)
	if n := follower.mints(t, "ok"); n != 0 {
		t.Fatalf("the new leader minted %v times at once", n)
	}
	st, _ := follower.s.UpstreamStatus()
	if st.Serial != prev.SerialNumber.Text(16) || !st.RenewAt.After(w.fake.Now()) {
		t.Fatalf("the new leader's renewal: %+v (now %v)", st, w.fake.Now())
	}
	c := w.start(t, "meshid-up-c")
	eventually(t, "a replacement replica signs with the Secret's intermediate", func() error {
		if !c.signing().Equal(prev) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	pair := []*replica{follower, c}
	prev = w.renew(t, follower, pair, prev)
	if n, nc := follower.mints(t, "ok"), c.mints(t, "ok"); n != 1 || nc != 0 {
		t.Fatalf("at the new leader's renewal point: %v mints by it, %v by the replacement; want 1 and 0", n, nc)
	}

	// The upstream's root replaced: the next intermediate is prepared on
	// both replicas (its root trusted, the current one still signing)
	// and activated at the leader's time on both.
	w.up.NewRoot(t)
	w.roots = append(w.roots, w.up.Root)
	w.mintAt(t, follower)
	eventually(t, "both replicas trust the new upstream root", func() error {
		for _, r := range pair {
			if !slices.ContainsFunc(r.s.Authority().Bundle().Roots, w.up.Root.Equal) {
				return fmt.Errorf("%s does not", r.name)
			}
		}
		return nil
	})
	var at []float64
	for _, r := range pair {
		if !w.sign(t, r).Equal(prev) {
			t.Fatalf("%s signs under the prepared intermediate before its activation", r.name)
		}
		at = append(at, testkit.Metric(t, r.reg, "meshid_ca_rotation_next_step_timestamp_seconds"))
	}
	if at[0] != at[1] || at[0] <= float64(w.fake.Now().Unix()) {
		t.Fatalf("activation at %v on the leader, %v on the replacement (now %v)", at[0], at[1], w.fake.Now().Unix())
	}
	next := w.stepUntilSwitched(t, follower, pair, prev)
	if next.CheckSignatureFrom(w.up.Root) != nil {
		t.Fatal("the activated intermediate is not the new root's")
	}
	if n, nc := follower.mints(t, "ok"), c.mints(t, "ok"); n != 2 || nc != 0 {
		t.Fatalf("after the root change: %v mints by the leader, %v by the replacement; want 2 and 0", n, nc)
	}
	if n := totalMints(t, []*replica{a, b, c}, "ok"); n != 5 {
		t.Fatalf("%v mints in all, want 5 (start, two renewals, two after the failover)", n)
	}
}

// lastContaining is the last log line containing sub.
func lastContaining(l *testkit.LogRecorder, sub string) string {
	lines := strings.Split(l.All(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return lines[i]
		}
	}
	return ""
}

func slicesKeys(m map[string][]byte) []string {
	var ks []string
	for k := range maps.Keys(m) {
		ks = append(ks, k)
	}
	return ks
}

// badSecret is an edit of the Secret a replica must refuse, and what its
// log must say.
type badSecret struct {
	name string
	data map[string][]byte
	want string
}

// badSecrets are edits of good: an intermediate of another CA (its own
// key, the upstream's roots), the intermediate with another key, an
// expired intermediate minted by the real cfssl for its key, a leaf the
// real cfssl signed for its key, and a value over the size limit.
func badSecrets(t *testing.T, w *world, good map[string][]byte) []badSecret {
	t.Helper()
	now := w.fake.Now()
	edit := func(f func(map[string][]byte)) map[string][]byte {
		d := maps.Clone(good)
		f(d)
		return d
	}
	keyPEM := func(k crypto.Signer) []byte {
		p, err := certs.EncodePrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	root, rootKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "not the upstream"}, NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 1})
	k := testkit.Key(t, certs.ECP256)
	td, _ := url.Parse("spiffe://" + w.td.Name())
	other := testkit.Certificate(t, &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "meshid intermediate CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs: []*url.URL{td},
	}, root, k.Public(), rootKey)

	// An intermediate the real cfssl signs for its key, dated so that it
	// has expired at the fake time.
	ek := testkit.Key(t, certs.ECP256)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "meshid intermediate CA", Organization: []string{w.td.Name()}}, URIs: []*url.URL{td},
	}, ek)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := cfssl.New(cfssl.Config{URL: w.url, CredentialsFile: w.up.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	w.up.SetClock(t, now.Add(-3*time.Hour))
	m, err := cf.MintX509CA(t.Context(), csr, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w.up.SetClock(t, now)
	if !m.Chain[0].NotAfter.Before(now) {
		t.Fatalf("cfssl's intermediate is not expired: %v", m.Chain[0].NotAfter)
	}

	// A leaf the real cfssl signs for a key (its leaf profile): it chains
	// to the upstream root and matches its key, but is no CA.
	leafURL, err := upstream.ParseURL("cfssl+https://" + w.up.Addr + "?profile=" + testkit.CFSSLProfileLeaf + "&ca=" + w.up.TLSCAFile)
	if err != nil {
		t.Fatal(err)
	}
	lf, err := cfssl.New(cfssl.Config{URL: leafURL, CredentialsFile: w.up.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	lk := testkit.Key(t, certs.ECP256)
	lcsr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "meshid intermediate CA"}, URIs: []*url.URL{td},
	}, lk)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := lf.MintX509CA(t.Context(), lcsr, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	return []badSecret{
		{"another CA's intermediate", edit(func(d map[string][]byte) {
			d[keystore.CACertFile], d[keystore.CAKeyFile], d[keystore.CertChainFile] = certs.EncodeCertificates(other), keyPEM(k), nil
		}), "does not chain to root-cert.pem"},
		{"not for its key", edit(func(d map[string][]byte) {
			d[keystore.CAKeyFile] = keyPEM(testkit.Key(t, certs.ECP256))
		}), "private key does not match the certificate"},
		{"expired", edit(func(d map[string][]byte) {
			d[keystore.CACertFile], d[keystore.CAKeyFile] = certs.EncodeCertificates(m.Chain[0]), keyPEM(ek)
		}), "expired at"},
		{"a leaf of the upstream", edit(func(d map[string][]byte) {
			d[keystore.CACertFile], d[keystore.CAKeyFile] = certs.EncodeCertificates(leaf.Chain[0]), keyPEM(lk)
		}), "not a CA"},
		{"huge", edit(func(d map[string][]byte) {
			d["padding"] = make([]byte, caserver.MaxUpstreamSecretSize)
		}), "bytes, more than the 262144 allowed"},
	}
}
