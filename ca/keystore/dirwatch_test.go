package keystore_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// kubeletVolume writes a directory the way the kubelet's atomic writer
// updates a Secret volume: the files live in a timestamped directory,
// ..data points at it, and each visible name is a symbolic link through
// ..data. An update writes a new timestamped directory, points ..data_tmp
// at it, renames ..data_tmp over ..data and removes the old directory.
type kubeletVolume struct {
	dir string
	gen int
	cur string // the timestamped directory ..data points at
}

func newKubeletVolume(t *testing.T, files map[string][]byte) *kubeletVolume {
	t.Helper()
	v := &kubeletVolume{dir: t.TempDir()}
	v.update(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

func (v *kubeletVolume) update(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.gen++
	ts := fmt.Sprintf("..2026_06_01_12_00_00.%09d", v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if data == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(v.dir, ts, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(v.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if v.cur != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, v.cur)); err != nil {
			t.Fatal(err)
		}
	}
	v.cur = ts
}

// watched is an Authority on a CA directory with a running DirWatcher.
type watched struct {
	authority *ca.Authority
	clk       *clock.Fake
	logs      *testkit.LogRecorder
	reg       *prometheus.Registry
}

func watchDir(t *testing.T, dir string, key keystore.DirWatcherConfig) *watched {
	t.Helper()
	w := &watched{clk: clock.NewFake(t0), logs: testkit.NewLogRecorder(), reg: prometheus.NewRegistry()}
	var (
		b   *keystore.Bundle
		err error
	)
	if key.Key != nil {
		b, err = keystore.LoadDirSigner(dir, key.Key, t0)
	} else {
		b, err = keystore.LoadDir(dir, t0)
	}
	if err != nil {
		t.Fatal(err)
	}
	w.authority, err = ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), Bundle: b, Clock: w.clk, Logger: w.logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := key
	cfg.Dir, cfg.Target, cfg.Clock, cfg.Logger, cfg.Registerer = dir, w.authority, w.clk, w.logs.Logger(), w.reg
	dw, err := keystore.NewDirWatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "dir watcher", dw.Run)
	// The first reload, once the watch is in place, finds what New loaded.
	w.logs.WaitFor(t, "CA directory unchanged", 1)
	return w
}

// fire waits for the watcher to arm its reload timer and lets it fire.
func (w *watched) fire(t *testing.T) {
	t.Helper()
	done := make(chan struct{})
	timer := time.AfterFunc(testkit.Guard, func() { close(done) })
	defer timer.Stop()
	if !w.clk.WaitForWaiters(1, done) {
		t.Fatalf("no reload scheduled after a change; logs:\n%s", w.logs.All())
	}
	w.clk.Add(keystore.DefaultDirReloadDelay)
}

func (w *watched) reloads(t *testing.T, result string) float64 {
	return testkit.Metric(t, w.reg, "meshid_ca_dir_reloads_total", "result", result)
}

// TestDirWatcherFollowsKubeletSwap: a rotation written through the
// kubelet's ..data swap is in use after the reload delay, with no restart;
// broken updates are refused one by one, each logged and counted, and the
// CA keeps signing with the last good bundle until a valid one arrives.
func TestDirWatcherFollowsKubeletSwap(t *testing.T) {
	h := newHierarchy(t)
	v := newKubeletVolume(t, istioFiles(t, h.ca, pemCerts(h.ca, h.int1, h.root), pemCerts(h.root)))
	w := watchDir(t, v.dir, keystore.DirWatcherConfig{})

	// Rotation to a new root: the new intermediate chains to it, and both
	// roots are trusted while workloads move over.
	root2 := mkCert(t, certSpec{cn: "root 2", isCA: true}, nil)
	ca2 := mkCert(t, certSpec{cn: "ca 2", isCA: true}, root2)
	v.update(t, istioFiles(t, ca2, pemCerts(ca2, root2), pemCerts(root2, h.root)))
	w.fire(t)
	w.logs.WaitFor(t, "CA directory reloaded", 1)
	b := w.authority.Bundle()
	if !b.Cert.Equal(ca2.cert) || len(b.Roots) != 2 || !b.Roots[0].Equal(root2.cert) || !b.Roots[1].Equal(h.root.cert) {
		t.Fatalf("after the swap the CA signs with %q under %d roots", b.Cert.Subject, len(b.Roots))
	}
	if got := w.reloads(t, keystore.ReloadApplied); got != 1 {
		t.Fatalf("applied reloads = %v, want 1", got)
	}

	other := mkCert(t, certSpec{cn: "other", isCA: true}, nil)
	expired := mkCert(t, certSpec{cn: "expired", isCA: true, notBefore: t0.Add(-48 * time.Hour), ttl: time.Hour}, root2)
	leaf := mkCert(t, certSpec{cn: "not a CA"}, root2)
	mismatched := istioFiles(t, ca2, pemCerts(ca2, root2), pemCerts(root2))
	mismatched[keystore.CAKeyFile] = pemKey(t, other.key)
	missing := istioFiles(t, ca2, pemCerts(ca2, root2), pemCerts(root2))
	delete(missing, keystore.CAKeyFile)
	broken := []struct {
		name  string
		files map[string][]byte
	}{
		{"key of another certificate", mismatched},
		{"key file missing", missing},
		{"expired signing certificate", istioFiles(t, expired, pemCerts(expired, root2), pemCerts(root2))},
		{"signing certificate not a CA", istioFiles(t, leaf, pemCerts(leaf, root2), pemCerts(root2))},
		{"chain to an unrelated root", istioFiles(t, ca2, pemCerts(ca2), pemCerts(other))},
		{"garbage", map[string][]byte{keystore.CACertFile: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), keystore.CAKeyFile: []byte("x")}},
	}
	for i, bad := range broken {
		t.Run(bad.name, func(t *testing.T) {
			v.update(t, bad.files)
			w.fire(t)
			w.logs.WaitFor(t, "CA directory update refused", i+1)
			if !w.authority.Bundle().Cert.Equal(ca2.cert) {
				t.Fatalf("the CA moved to %q", w.authority.Bundle().Cert.Subject)
			}
			if got := w.reloads(t, keystore.ReloadFailed); got != float64(i+1) {
				t.Fatalf("failed reloads = %v, want %d", got, i+1)
			}
		})
	}
	if n := w.logs.CountContaining("PRIVATE KEY"); n != 0 {
		t.Fatalf("%d log records hold key material:\n%s", n, w.logs.All())
	}

	// The operator fixes the Secret: the CA follows again.
	ca3 := mkCert(t, certSpec{cn: "ca 3", isCA: true}, root2)
	v.update(t, istioFiles(t, ca3, pemCerts(ca3, root2), pemCerts(root2)))
	w.fire(t)
	w.logs.WaitFor(t, "CA directory reloaded", 2)
	if !w.authority.Bundle().Cert.Equal(ca3.cert) {
		t.Fatalf("after the fix the CA signs with %q", w.authority.Bundle().Cert.Subject)
	}
}

// TestDirWatcherStorm: 10,000 writes to a plain directory (no kubelet)
// make no reload by themselves: the reloads wait for the delay, so a
// directory changing without pause costs at most one reload per delay.
// The last write, a new valid CA, is what that one reload finds.
func TestDirWatcherStorm(t *testing.T) {
	h := newHierarchy(t)
	files := istioFiles(t, h.ca, pemCerts(h.ca, h.int1, h.root), pemCerts(h.root))
	dir := writeDir(t, files)
	w := watchDir(t, dir, keystore.DirWatcherConfig{})
	f, err := os.OpenFile(filepath.Join(dir, keystore.RootCertFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 10_000 { // each write is a change event
		if _, err := f.WriteAt(files[keystore.RootCertFile], 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	ca2 := mkCert(t, certSpec{cn: "ca 2", isCA: true}, h.int1)
	for name, data := range istioFiles(t, ca2, pemCerts(ca2, h.int1, h.root), pemCerts(h.root)) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w.fire(t)
	w.logs.WaitFor(t, "CA directory reloaded", 1)
	if !w.authority.Bundle().Cert.Equal(ca2.cert) {
		t.Fatalf("the CA signs with %q", w.authority.Bundle().Cert.Subject)
	}
	total := w.reloads(t, keystore.ReloadApplied) + w.reloads(t, keystore.ReloadUnchanged) + w.reloads(t, keystore.ReloadFailed)
	if total != 2 { // the one at start, and the one after the delay
		t.Fatalf("%v reloads for 10,004 writes, want 2", total)
	}
}

// TestDirWatcherExternalKey: with the key held outside the directory
// (--ca-key), a renewed certificate for that key is picked up, and one for
// another key is refused.
func TestDirWatcherExternalKey(t *testing.T) {
	h := newHierarchy(t)
	noKey := func(c *issued) map[string][]byte {
		f := istioFiles(t, c, pemCerts(c, h.int1, h.root), pemCerts(h.root))
		delete(f, keystore.CAKeyFile)
		return f
	}
	v := newKubeletVolume(t, noKey(h.ca))
	w := watchDir(t, v.dir, keystore.DirWatcherConfig{Key: h.ca.key})

	renewed := &issued{key: h.ca.key}
	renewed.cert = reissue(t, h.ca.cert, h.int1)
	v.update(t, noKey(renewed))
	w.fire(t)
	w.logs.WaitFor(t, "CA directory reloaded", 1)
	if !w.authority.Bundle().Cert.Equal(renewed.cert) {
		t.Fatal("the renewed certificate is not in use")
	}

	v.update(t, noKey(mkCert(t, certSpec{cn: "other key", isCA: true}, h.int1)))
	w.fire(t)
	w.logs.WaitFor(t, "CA directory update refused", 1)
	if !w.authority.Bundle().Cert.Equal(renewed.cert) {
		t.Fatal("a certificate for another key replaced the CA")
	}
}

// reissue signs c's public key and subject again under parent, with a new
// serial: a renewal of the same key.
func reissue(t *testing.T, c *x509.Certificate, parent *issued) *x509.Certificate {
	t.Helper()
	tmpl := *c
	tmpl.SerialNumber = new(big.Int).Add(c.SerialNumber, big.NewInt(1))
	tmpl.NotAfter = c.NotAfter.Add(time.Hour)
	return testkit.Certificate(t, &tmpl, parent.cert, c.PublicKey, parent.key)
}

func TestDirWatcherConfigErrors(t *testing.T) {
	a := testkit.NewAuthority(t, spiffeid.RequireTrustDomainFromString("example.org"), nil, nil)
	for name, cfg := range map[string]keystore.DirWatcherConfig{
		"no directory":   {Target: a},
		"no target":      {Dir: t.TempDir()},
		"negative delay": {Dir: t.TempDir(), Target: a, ReloadDelay: -time.Second},
	} {
		if _, err := keystore.NewDirWatcher(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A directory that cannot be watched fails Run, not silently.
	dw, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: filepath.Join(t.TempDir(), "absent"), Target: a})
	if err != nil {
		t.Fatal(err)
	}
	if err := dw.Run(context.Background()); err == nil {
		t.Fatal("Run watched an absent directory")
	}
}
