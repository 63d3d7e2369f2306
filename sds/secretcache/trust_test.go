package secretcache_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/rootfile"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// ROOTCA is the union of the CA answer's roots and the re-read root file:
// a root added to the file (a CA rotation's new root, published in the
// ConfigMap) is pushed within the refresh interval, a half-written file
// changes nothing, and each new bundle reaches OnRoots (the CA client).
func TestRootsUnionWithRootFile(t *testing.T) {
	const refresh = time.Minute
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	var (
		mu     sync.Mutex
		hooked [][]*x509.Certificate
	)
	var f *fixture
	f = newFixture(t, func(c *secretcache.Config) {
		c.RootFile, c.RootRefresh = file, refresh
		c.OnRoots = func(r []*x509.Certificate) { mu.Lock(); hooked = append(hooked, r); mu.Unlock() }
	})
	caRoot := f.ca.currentRoot()
	write := func(data []byte) { t.Helper(); writeFile(t, file, data) }
	write(certs.EncodeCertificates(caRoot))
	// Watched before Run: Run's first read of the file publishes ROOTCA
	// and the CA's answer (the same roots) changes nothing after it, so a
	// watch registered after that read saw no notification (7 failures in
	// 40 runs of TestRootsUnionWithRootFile on c30f24e under load).
	roots := watch(t, f.m, secretcache.RootName)
	f.run(t)
	if _, err := f.m.Secret(context.Background(), secretcache.DefaultName); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, roots, "first ROOTCA").Roots; len(got) != 1 || !got[0].Equal(caRoot) {
		t.Fatalf("first ROOTCA: %d roots", len(got))
	}
	// The CA's next root appears in the file first (the CA's bundle).
	nextCA := newTestCA(t, f.clock)
	next := nextCA.currentRoot()
	write(certs.EncodeCertificates(caRoot, next))
	tick := func() {
		t.Helper()
		testkit.WaitForTimers(t, f.clock, 2, "the renewal and the refresh")
		f.clock.Add(refresh)
	}
	tick()
	if got := receive(t, roots, "ROOTCA with the file's new root").Roots; len(got) != 2 || !got[0].Equal(caRoot) || !got[1].Equal(next) {
		t.Fatalf("ROOTCA after the file changed: %d roots", len(got))
	}
	mu.Lock()
	if n := len(hooked); n != 2 || len(hooked[1]) != 2 {
		t.Fatalf("OnRoots called %d times", n)
	}
	mu.Unlock()
	// Half written, then gone: the file's roots stay as they were (a push
	// of the answer's root alone would arrive before the one below).
	write([]byte("-----BEGIN CERTIFICATE-----\nMIIB"))
	tick()
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	tick()
	// The CA signs under the new root and the old root is retired: the
	// bundle shrinks to the new root.
	write(certs.EncodeCertificates(next))
	f.ca.mu.Lock()
	f.ca.root, f.ca.rootKey = nextCA.root, nextCA.rootKey
	f.ca.mu.Unlock()
	if err := f.m.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, roots, "ROOTCA after the rotation").Roots; len(got) != 2 || !got[0].Equal(next) {
		t.Fatalf("ROOTCA after the rotation: %d roots, want the answer's new root, then the file's old one", len(got))
	}
	tick()
	if got := receive(t, roots, "ROOTCA after the file's re-read").Roots; len(got) != 1 || !got[0].Equal(next) {
		t.Fatalf("ROOTCA after the file's re-read: %d roots, want only the new root", len(got))
	}
}

// TestRootFileRefusedKeepsRoots: a root file replaced by something that is
// not the mesh's roots (17 roots, a link to the system CA bundle) is
// refused at the re-read with a warning naming the file, and ROOTCA and the
// CA client keep the previous roots; the two-root union of a CA rotation
// that follows is pushed.
func TestRootFileRefusedKeepsRoots(t *testing.T) {
	const refresh = time.Minute
	dir := t.TempDir()
	file := filepath.Join(dir, "root-cert.pem")
	var hooked int
	var mu sync.Mutex
	f := newFixture(t, func(c *secretcache.Config) {
		c.RootFile, c.RootRefresh = file, refresh
		c.OnRoots = func([]*x509.Certificate) { mu.Lock(); hooked++; mu.Unlock() }
	})
	caRoot := f.ca.currentRoot()
	write := func(data []byte) {
		t.Helper()
		os.Remove(file) // it may be the symlink to the system bundle
		writeFile(t, file, data)
	}
	write(certs.EncodeCertificates(caRoot))
	roots := watch(t, f.m, secretcache.RootName) // before Run: see above
	f.run(t)
	if _, err := f.m.Secret(context.Background(), secretcache.DefaultName); err != nil {
		t.Fatal(err)
	}
	receive(t, roots, "first ROOTCA")
	tick := func() {
		t.Helper()
		testkit.WaitForTimers(t, f.clock, 2, "the renewal and the refresh")
		f.clock.Add(refresh)
	}
	many := []*x509.Certificate{caRoot}
	for range 16 {
		many = append(many, newTestCA(t, f.clock).currentRoot())
	}
	write(certs.EncodeCertificates(many...))
	tick()
	f.logs.WaitForContaining(t, file+": 17 certificates, more than the 16 roots", 1)

	sys := ""
	for _, p := range rootfile.SystemBundles {
		if _, err := os.Stat(p); err == nil {
			sys = p
			break
		}
	}
	if sys != "" {
		os.Remove(file)
		if err := os.Symlink(sys, file); err != nil {
			t.Fatal(err)
		}
		tick()
		f.logs.WaitForContaining(t, "is the system CA bundle", 1)
	}
	// Each refusal is logged before readRootFile returns, so a push of
	// the refused roots would be waiting here already.
	select {
	case s := <-roots:
		t.Fatalf("a refused root file was pushed: %d roots", len(s.Roots))
	default:
	}
	mu.Lock()
	if hooked != 1 {
		t.Fatalf("OnRoots called %d times, want once (the first bundle)", hooked)
	}
	mu.Unlock()

	next := newTestCA(t, f.clock).currentRoot()
	write(certs.EncodeCertificates(caRoot, next))
	tick()
	if got := receive(t, roots, "ROOTCA with the rotation's union").Roots; len(got) != 2 || !got[0].Equal(caRoot) || !got[1].Equal(next) {
		t.Fatalf("ROOTCA after the union: %d roots", len(got))
	}
}

// TestRootFileReadAtStart: an agent started during a CA rotation, whose
// root file already holds the old and the new root, pushes both in ROOTCA
// (and hands both to the CA client) without waiting a refresh interval:
// the CA starts signing with the new root two intervals after publishing
// it, which may be less than one interval after this agent started.
func TestRootFileReadAtStart(t *testing.T) {
	const refresh = time.Hour
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	var (
		mu     sync.Mutex
		hooked []*x509.Certificate
	)
	f := newFixture(t, func(c *secretcache.Config) {
		c.RootFile, c.RootRefresh = file, refresh
		c.OnRoots = func(r []*x509.Certificate) { mu.Lock(); hooked = r; mu.Unlock() }
	})
	caRoot := f.ca.currentRoot()
	next := newTestCA(t, f.clock).currentRoot()
	writeFile(t, file, certs.EncodeCertificates(caRoot, next))
	roots := watch(t, f.m, secretcache.RootName) // before Run: see above
	f.run(t)
	if _, err := f.m.Secret(context.Background(), secretcache.DefaultName); err != nil {
		t.Fatal(err)
	}
	// The clock never moves: whatever ROOTCA holds came from the first read.
	for {
		got := receive(t, roots, "ROOTCA with the file's two roots").Roots
		if len(got) == 2 {
			if !slices.ContainsFunc(got, next.Equal) || !slices.ContainsFunc(got, caRoot.Equal) {
				t.Fatalf("ROOTCA: want the old and the new root")
			}
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != 2 {
		t.Fatalf("the CA client was given %d roots, want 2", len(hooked))
	}
}

// Without RootRefresh, RootFile is re-read every DefaultRootRefresh.
func TestRootFileDefaultRefresh(t *testing.T) {
	file := filepath.Join(t.TempDir(), "root.pem")
	writeFile(t, file, newPair(t, "root").certPEM)
	f := newFixture(t, func(c *secretcache.Config) { c.RootFile = file })
	f.run(t)
	if d := testkit.NextDeadline(t, f.clock, "the root file's refresh").Sub(f.clock.Now()); d != secretcache.DefaultRootRefresh {
		t.Fatalf("root file re-read after %v, want %v", d, secretcache.DefaultRootRefresh)
	}
}
