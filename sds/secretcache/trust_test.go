package secretcache_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretcache"
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
	write := func(data []byte) {
		t.Helper()
		if err := certs.WriteFileAtomic(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(certs.EncodeCertificates(caRoot))
	f.run(t)
	roots := watch(t, f.m, secretcache.RootName)
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
		stop := make(chan struct{})
		tm := time.AfterFunc(20*time.Second, func() { close(stop) })
		defer tm.Stop()
		if !f.clock.WaitForWaiters(2, stop) { // the renewal and the refresh
			t.Fatal("the refresh did not wait on the clock")
		}
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
