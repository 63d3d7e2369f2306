//go:build cgo

package caserver_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/keystore/pkcs11/softhsm"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// hsmWorld is the assembled CA whose intermediates the real cfssl serve
// mints, each with a new key in a real SoftHSM2 token.
type hsmWorld struct {
	up   *testkit.CFSSL
	tk   *softhsm.Token
	uri  *pkcs11.URI
	fake *clock.Fake
	dir  string
	td   spiffeid.TrustDomain
	logs *testkit.LogRecorder
	cfg  caserver.Config
}

const hsmLabel = "meshid-upstream"

func newHSMWorld(t *testing.T, life time.Duration, renewAt float64) *hsmWorld {
	t.Helper()
	w := &hsmWorld{
		up:   testkit.StartCFSSL(t, life),
		tk:   softhsm.New(t),
		fake: clock.NewFake(time.Now()),
		dir:  t.TempDir(),
		td:   spiffeid.RequireTrustDomainFromString("example.org"),
		logs: testkit.NewLogRecorder(),
	}
	w.up.SetClock(t, w.fake.Now())
	var err error
	if w.uri, err = pkcs11.ParseURI(w.tk.URI(hsmLabel)); err != nil {
		t.Fatal(err)
	}
	u, err := upstream.ParseURL("cfssl+https://" + w.up.Addr + "?profile=" + testkit.CFSSLProfileCA + "&ca=" + w.up.TLSCAFile)
	if err != nil {
		t.Fatal(err)
	}
	w.cfg = caserver.Config{
		TrustDomain: w.td, StateDir: w.dir, Listen: "127.0.0.1:0", CAKey: w.uri,
		Upstream: caserver.UpstreamConfig{URL: u, CredentialsFile: w.up.KeyFile, Lifetime: life, RenewAt: renewAt},
		Rotation: caserver.RotationConfig{Propagation: 10 * time.Minute},
		Clock:    w.fake, Logger: w.logs.Logger(),
	}
	return w
}

// start runs a CA on w's state with a registry of its own, until stop
// (or the test's end).
func (w *hsmWorld) start(t *testing.T) (s *caserver.Server, reg *prometheus.Registry, stop func()) {
	t.Helper()
	cfg := w.cfg
	reg = prometheus.NewRegistry()
	cfg.Registerer = reg
	s, err := caserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	stop = testkit.Start(t, "CA", s.Run)
	t.Cleanup(stop)
	return s, reg, stop
}

// keys lists the token's keys with the CA's label.
func (w *hsmWorld) keys(t *testing.T) []pkcs11.KeyInfo {
	t.Helper()
	ks, err := pkcs11.List(pkcs11.Config{URI: w.uri})
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// onlyKey waits until the token holds one key, that of c, and returns it.
func (w *hsmWorld) onlyKey(t *testing.T, c *x509.Certificate) pkcs11.KeyInfo {
	t.Helper()
	var ks []pkcs11.KeyInfo
	testkit.Until(t, "the token holding the signing intermediate's key only", func() bool {
		ks = w.keys(t)
		return len(ks) == 1 && samePublic(ks[0], c)
	})
	k := ks[0]
	if !k.Sensitive || k.Extractable || k.Label != hsmLabel {
		t.Fatalf("key %x: label %q, sensitive %v, extractable %v: want a sensitive, non-extractable key labelled %q", k.ID, k.Label, k.Sensitive, k.Extractable, hsmLabel)
	}
	return k
}

func samePublic(k pkcs11.KeyInfo, c *x509.Certificate) bool {
	e, ok := k.Public.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(c.PublicKey)
}

// checkState: the state directory names the key id in upstream/ (mode
// 0600, no PIN) and holds no ca-key.pem anywhere.
func (w *hsmWorld) checkState(t *testing.T, id []byte) {
	t.Helper()
	err := filepath.WalkDir(w.dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == keystore.CAKeyFile {
			t.Errorf("%s: a key file in the state directory while the key is in the module", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(w.dir, "upstream", upstream.KeyIDFile)
	got, err := upstream.ReadKeyID(f)
	if err != nil || !bytes.Equal(got, id) {
		t.Fatalf("%s names %x (%v), want the signing key %x", f, got, err, id)
	}
	data, _ := os.ReadFile(f)
	st, _ := os.Stat(f)
	if bytes.Contains(data, []byte(w.tk.PIN)) || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: mode %v, %q", f, st.Mode(), data)
	}
}

// signChains has s sign a leaf and checks that it chains to root.
func signChains(t *testing.T, s *caserver.Server, td spiffeid.TrustDomain, root *x509.Certificate) {
	t.Helper()
	id := spiffeid.RequireFromPath(td, "/ns/ns1/sa/a")
	csr, err := ca.VerifyCSR(testkit.CSR(t, testkit.Key(t, certs.ECP256), id))
	if err != nil {
		t.Fatal(err)
	}
	is, err := s.Authority().Sign(context.Background(), ca.Request{CSR: csr, ID: id, Caller: "test"})
	if err != nil {
		t.Fatalf("the CA does not sign: %v", err)
	}
	if _, err := certs.VerifyChain(append([]*x509.Certificate{is.Leaf}, is.Chain...), []*x509.Certificate{root}, is.Leaf.NotBefore.Add(time.Second)); err != nil {
		t.Fatalf("the leaf (from %v) does not chain to the upstream root under %s (from %v): %v", is.Leaf.NotBefore, is.Chain[0].Subject, is.Chain[0].NotBefore, err)
	}
}

func mintsOK(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	v, _ := testkit.LookupMetric(t, reg, "meshid_ca_upstream_mints_total", "result", "ok")
	return v
}

// renew moves the fake clock (and cfssl's) to the renewal point and waits
// for the new intermediate.
func (w *hsmWorld) renew(t *testing.T, s *caserver.Server) upstream.Status {
	t.Helper()
	st, _ := s.UpstreamStatus()
	w.up.SetClock(t, st.RenewAt)
	testkit.Until(t, "the renewer's timer", func() bool { return slices.ContainsFunc(w.fake.Deadlines(), st.RenewAt.Equal) })
	w.fake.Set(st.RenewAt)
	var cur upstream.Status
	testkit.Until(t, "the renewal", func() bool {
		cur, _ = s.UpstreamStatus()
		return cur.Serial != st.Serial || cur.Failures > 0
	})
	if cur.Failures > 0 {
		t.Fatalf("renewal failed: %s", cur.LastError)
	}
	return cur
}

// TestUpstreamModuleKey (issue 32, real cfssl serve and SoftHSM2): a CA
// with --upstream and --ca-key and no intermediate mints one whose key is
// created in the module (sensitive, not extractable, the CSR signed
// there): no ca-key.pem anywhere, upstream/ names the key's id, leaves
// chain to cfssl's root. Three renewals, each with a new key, the old one
// destroyed from the token. A restart loads the saved module key and
// mints nothing.
func TestUpstreamModuleKey(t *testing.T) {
	w := newHSMWorld(t, time.Hour, 0.5)
	s, reg, stop := w.start(t)
	if n := mintsOK(t, reg); n != 1 {
		t.Fatalf("%v mints at the first start, want 1", n)
	}
	k := w.onlyKey(t, s.Authority().Bundle().Cert)
	w.checkState(t, k.ID)
	signChains(t, s, w.td, w.up.Root)

	ids := map[string]bool{hex.EncodeToString(k.ID): true}
	for i := 1; i <= 3; i++ {
		w.renew(t, s)
		b := s.Authority().Bundle()
		k := w.onlyKey(t, b.Cert) // the old key is destroyed
		if ids[hex.EncodeToString(k.ID)] {
			t.Fatalf("renewal %d reused key %x", i, k.ID)
		}
		ids[hex.EncodeToString(k.ID)] = true
		w.checkState(t, k.ID)
		signChains(t, s, w.td, w.up.Root)
	}
	if n := mintsOK(t, reg); n != 4 {
		t.Fatalf("%v mints, want 4", n)
	}
	last := s.Authority().Bundle().Cert
	stop()

	s2, reg2, stop2 := w.start(t)
	if n := mintsOK(t, reg2); n != 0 || !s2.Authority().Bundle().Cert.Equal(last) {
		t.Fatalf("restarted: %v mints, signing %v: want the saved intermediate, no mint", n, s2.Authority().Bundle().Cert.SerialNumber)
	}
	k = w.onlyKey(t, last)
	w.checkState(t, k.ID)
	signChains(t, s2, w.td, w.up.Root)
	stop2()

	// Down past the intermediate's expiry: the restart mints with a new
	// key and destroys the expired one's.
	w.fake.Set(last.NotAfter.Add(time.Minute))
	w.up.SetClock(t, w.fake.Now())
	s3, reg3, _ := w.start(t)
	if n := mintsOK(t, reg3); n != 1 || s3.Authority().Bundle().Cert.Equal(last) {
		t.Fatalf("restarted after the expiry: %v mints; want 1, a new intermediate", n)
	}
	k3 := w.onlyKey(t, s3.Authority().Bundle().Cert)
	if bytes.Equal(k3.ID, k.ID) {
		t.Fatal("the expired intermediate's key was reused")
	}
	w.checkState(t, k3.ID)
	signChains(t, s3, w.td, w.up.Root)
}

// TestUpstreamSoftwareKeyToModule: a CA whose intermediate's key was in
// upstream/ca-key.pem, restarted with --ca-key, mints an intermediate
// with a key in the module and removes ca-key.pem.
func TestUpstreamSoftwareKeyToModule(t *testing.T) {
	w := newHSMWorld(t, time.Hour, 0.5)
	soft := w.cfg
	soft.CAKey = nil
	s, err := caserver.New(soft)
	if err != nil {
		t.Fatal(err)
	}
	first := s.Authority().Bundle().Cert
	if _, err := os.Stat(filepath.Join(w.dir, "upstream", keystore.CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	s2, reg, _ := w.start(t)
	if mintsOK(t, reg) != 1 || s2.Authority().Bundle().Cert.Equal(first) {
		t.Fatal("the software key's intermediate was kept")
	}
	k := w.onlyKey(t, s2.Authority().Bundle().Cert)
	w.checkState(t, k.ID)
}

// TestUpstreamModuleKeyDownTwoRenewalPeriods: TestUpstreamDownTwoRenewalPeriods'
// cycle with the key in SoftHSM2: cfssl stopped at the renewal point for
// two renewal periods; every attempt's new key is destroyed when its mint
// fails (the token holds the signing key only), signing goes on, and the
// renewal succeeds with a new module key when cfssl is back.
func TestUpstreamModuleKeyDownTwoRenewalPeriods(t *testing.T) {
	const life, renewAt = time.Hour, 0.25
	w := newHSMWorld(t, life, renewAt)
	s, _, _ := w.start(t)
	first := s.Authority().Bundle().Cert
	k0 := w.onlyKey(t, first)
	st0, _ := s.UpstreamStatus()
	w.up.Stop()
	w.fake.Set(st0.RenewAt)
	seen, attempts := st0.Failures, 0
	for w.fake.Now().Before(st0.RenewAt.Add(2 * time.Duration(renewAt*float64(life)))) {
		testkit.Until(t, "the renewer's attempt", func() bool {
			cur, _ := s.UpstreamStatus()
			return cur.Failures > seen
		})
		cur, _ := s.UpstreamStatus()
		seen = cur.Failures
		attempts++
		if !s.Authority().Bundle().Cert.Equal(first) {
			t.Fatal("the intermediate changed while the upstream was down")
		}
		if ks := w.keys(t); len(ks) != 1 || !bytes.Equal(ks[0].ID, k0.ID) {
			t.Fatalf("attempt %d: the token holds %d keys: a failed mint left its key", attempts, len(ks))
		}
		signChains(t, s, w.td, w.up.Root)
		testkit.Until(t, "the renewer's retry timer", func() bool {
			return slices.ContainsFunc(w.fake.Deadlines(), cur.RetryAt.Equal)
		})
		w.fake.Set(cur.RetryAt)
	}
	if attempts < 10 {
		t.Fatalf("%d attempts in two renewal periods", attempts)
	}
	testkit.Until(t, "the last attempt", func() bool {
		cur, _ := s.UpstreamStatus()
		return cur.RetryAt.After(w.fake.Now())
	})
	cur, _ := s.UpstreamStatus()
	w.up.Start(t)
	w.up.SetClock(t, cur.RetryAt)
	w.fake.Set(cur.RetryAt)
	testkit.Until(t, "the renewal once cfssl is back", func() bool {
		cur, _ := s.UpstreamStatus()
		return cur.Failures == 0 && !s.Authority().Bundle().Cert.Equal(first)
	})
	k := w.onlyKey(t, s.Authority().Bundle().Cert)
	if bytes.Equal(k.ID, k0.ID) {
		t.Fatal("the renewal reused the key")
	}
	w.checkState(t, k.ID)
	signChains(t, s, w.td, w.up.Root)
}

// TestUpstreamModuleKeyNewRoot: a renewal under a new upstream root is
// prepared with its own module key (kept in upstream/next by its id), the
// CA restarts while it is prepared and mints nothing, and at the
// activation the new intermediate moves into upstream/ and the old key is
// destroyed.
func TestUpstreamModuleKeyNewRoot(t *testing.T) {
	w := newHSMWorld(t, time.Hour, 0.5)
	s, _, stop := w.start(t)
	old := s.Authority().Bundle().Cert
	k0 := w.onlyKey(t, old)
	w.up.NewRoot(t)
	w.renew(t, s)
	rs := s.Rotation().Status()
	if rs.Prepared == nil || !s.Authority().Bundle().Cert.Equal(old) {
		t.Fatalf("the new root's intermediate is not prepared: prepared %v, the old one signing %v; logs:\n%s", rs.Prepared != nil, s.Authority().Bundle().Cert.Equal(old), w.logs.All())
	}
	if ks := w.keys(t); len(ks) != 2 {
		t.Fatalf("the token holds %d keys (%+v) while one signs and one is prepared; logs:\n%s", len(ks), ks, w.logs.All())
	}
	next, err := upstream.ReadKeyID(filepath.Join(w.dir, "upstream", "next", upstream.KeyIDFile))
	if err != nil || bytes.Equal(next, k0.ID) {
		t.Fatalf("upstream/next names %x (%v), the first key is %x", next, err, k0.ID)
	}
	stop()

	s2, reg2, _ := w.start(t)
	rs = s2.Rotation().Status()
	if n := mintsOK(t, reg2); n != 0 || rs.Prepared == nil || !s2.Authority().Bundle().Cert.Equal(old) {
		t.Fatalf("restarted: %v mints, prepared %v, the old one signing %v: want the old intermediate signing, the new one prepared again, no mint; logs:\n%s",
			n, rs.Prepared != nil, s2.Authority().Bundle().Cert.Equal(old), w.logs.All())
	}
	testkit.Until(t, "the activation timer", func() bool { return slices.ContainsFunc(w.fake.Deadlines(), rs.ActivateAt.Equal) })
	w.fake.Set(rs.ActivateAt)
	testkit.Until(t, "the activation", func() bool { return s2.Authority().Bundle().Cert.Equal(rs.Prepared) })
	k := w.onlyKey(t, rs.Prepared)
	if !bytes.Equal(k.ID, next) {
		t.Fatalf("the signing key %x is not the one upstream/next named (%x)", k.ID, next)
	}
	testkit.Until(t, "upstream/next moved into upstream/", func() bool {
		_, err := os.Stat(filepath.Join(w.dir, "upstream", "next"))
		return os.IsNotExist(err)
	})
	w.checkState(t, k.ID)
	signChains(t, s2, w.td, w.up.Root)
}

// TestUpstreamModuleKeyStateRefused: an attacker's (or a broken) file
// naming the intermediate's module key — huge, writable by others, a
// symbolic link, garbage, the id of a key the token does not hold, the id
// of another key of the token, or the file without --ca-key — stops the
// start with an error saying why: nothing is minted, no file of the state
// directory and no key of the token changes.
func TestUpstreamModuleKeyStateRefused(t *testing.T) {
	w := newHSMWorld(t, time.Hour, 0.5)
	s, _, stop := w.start(t)
	signing := w.onlyKey(t, s.Authority().Bundle().Cert)
	stop()
	// Another key of the token, with the CA's label.
	other := make([]byte, upstream.KeyIDSize)
	other[0] = 0x42
	ou := *w.uri
	ou.ID = other
	ok, err := pkcs11.Generate(pkcs11.Config{URI: &ou}, certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.Close(); err != nil {
		t.Fatal(err)
	}
	idFile := filepath.Join(w.dir, "upstream", upstream.KeyIDFile)
	good, err := os.ReadFile(idFile)
	if err != nil {
		t.Fatal(err)
	}
	write := func(data []byte, mode os.FileMode) func() {
		return func() {
			if err := os.Remove(idFile); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(idFile, data, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(idFile, mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name   string
		tamper func()
		noKey  bool // start without --ca-key
		want   string
	}{
		{name: "huge", tamper: write(bytes.Repeat([]byte("{"), 1<<20), 0o600), want: "more than"},
		{name: "writable by others", tamper: write(good, 0o666), want: "lets others write"},
		{name: "symbolic link", tamper: func() {
			target := filepath.Join(t.TempDir(), "id")
			if err := os.WriteFile(target, good, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(idFile); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, idFile); err != nil {
				t.Fatal(err)
			}
		}, want: "not a regular file"},
		{name: "garbage", tamper: write([]byte("-----BEGIN EC PRIVATE KEY-----\n"), 0o600), want: "not one"},
		{name: "a key the token does not hold", tamper: write(upstream.EncodeKeyID(bytes.Repeat([]byte{7}, 16)), 0o600), want: "which the module does not give"},
		{name: "another key of the token", tamper: write(upstream.EncodeKeyID(other), 0o600), want: "whose public key is not the one of"},
		{name: "no --ca-key", tamper: write(good, 0o600), noKey: true, want: "names a key in a PKCS#11 module"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.tamper()
			files, keys := snapshot(t, w.dir), w.keys(t)
			cfg := w.cfg
			reg := prometheus.NewRegistry()
			cfg.Registerer = reg
			if c.noKey {
				cfg.CAKey = nil
			}
			_, err := caserver.New(cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("start: %v, want an error with %q", err, c.want)
			}
			if strings.Contains(err.Error(), w.tk.PIN) {
				t.Fatalf("the error holds the PIN: %v", err)
			}
			if n := mintsOK(t, reg); n != 0 {
				t.Fatalf("%v mints", n)
			}
			if after := snapshot(t, w.dir); !maps(files, after) {
				t.Fatal("the state directory changed")
			}
			if after := w.keys(t); len(after) != len(keys) || len(after) != 2 {
				t.Fatalf("the token's keys changed: %d, then %d", len(keys), len(after))
			}
		})
	}
	// --ca-key naming one key (id=) with --upstream: each mint needs a new one.
	withID := w.cfg
	withID.CAKey = &ou
	if _, err := caserver.New(withID); err == nil || !strings.Contains(err.Error(), "no id=") {
		t.Fatalf("--ca-key with id= and --upstream: %v", err)
	}
	// With --kube-ca-secret the replicas share the intermediate: not with
	// a module key yet.
	shared := w.cfg
	shared.KubeCASecret, shared.Kube.Namespace = true, "istio-system"
	if _, err := caserver.New(shared); err == nil || !strings.Contains(err.Error(), "not supported yet") {
		t.Fatalf("--ca-key with --upstream and --kube-ca-secret: %v", err)
	}
	write(good, 0o600)()
	s2, reg2, _ := w.start(t)
	if mintsOK(t, reg2) != 0 || !samePublic(signing, s2.Authority().Bundle().Cert) {
		t.Fatal("with the file restored, the CA does not sign with its saved module key")
	}
}

// snapshot maps each file under dir to its mode and content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		data, _ := os.ReadFile(path)
		out[path] = info.Mode().String() + string(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
