package secretcache_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// pair is a certificate and its key, created at run time.
type pair struct {
	cert            *x509.Certificate
	key             crypto.Signer
	certPEM, keyPEM []byte
}

func newPair(t *testing.T, cn string) pair {
	t.Helper()
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	c, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: cn}, Key: key, NotBefore: epoch.Add(-time.Hour), TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pair{cert: c, key: key, certPEM: certs.EncodeCertificates(c), keyPEM: keyPEM}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := certs.WriteFileAtomic(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeDataDir writes a Kubernetes-style timestamped data directory.
func writeDataDir(t *testing.T, dir, ts string, p pair) {
	t.Helper()
	d := filepath.Join(dir, ts)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(d, "cert.pem"), p.certPEM)
	writeFile(t, filepath.Join(d, "key.pem"), p.keyPEM)
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestFileCertSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	p1, p2 := newPair(t, "one"), newPair(t, "two")
	// The layout the kubelet makes for a Secret volume.
	writeDataDir(t, dir, "..2026_03_01_12_00_00.1", p1)
	mustSymlink(t, "..2026_03_01_12_00_00.1", filepath.Join(dir, "..data"))
	mustSymlink(t, "..data/cert.pem", filepath.Join(dir, "cert.pem"))
	mustSymlink(t, "..data/key.pem", filepath.Join(dir, "key.pem"))
	name := secretcache.FileCertPrefix + filepath.Join(dir, "cert.pem") + "~" + filepath.Join(dir, "key.pem")

	f := newFixture(t, nil)
	// Watch, then Secret, as the SDS server does: the first load is
	// pushed too.
	ch := watch(t, f.m, name)
	v1 := mustSecret(t, f.m, name)
	if !v1.Chain[0].Equal(p1.cert) || !certs.KeyMatches(v1.Chain[0].PublicKey, v1.Key) || v1.Name != name || v1.TrustDomain != testTD {
		t.Fatalf("first load: %+v", v1)
	}
	receive(t, ch, "first load")
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 1)

	// The kubelet's atomic update: a new timestamped directory, a new
	// symlink renamed over ..data, the old directory removed.
	writeDataDir(t, dir, "..2026_03_01_13_00_00.2", p2)
	mustSymlink(t, "..2026_03_01_13_00_00.2", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_03_01_12_00_00.1")); err != nil {
		t.Fatal(err)
	}
	v2 := receive(t, ch, "symlink swap")
	if !v2.Chain[0].Equal(p2.cert) || !certs.KeyMatches(v2.Chain[0].PublicKey, v2.Key) || v2.Version == v1.Version {
		t.Fatal("push after the swap does not hold the new pair")
	}
	if s := mustSecret(t, f.m, name); s.Version != v2.Version {
		t.Fatal("Secret does not serve the swapped pair")
	}
	if n := f.ca.calls.Load(); n != 0 {
		t.Fatalf("file secrets sent %d CSRs", n)
	}
}

func TestFileRootHalfWrittenNotServed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "root-cert.pem")
	a, b, c, d := newPair(t, "a"), newPair(t, "b"), newPair(t, "c"), newPair(t, "d")
	writeFile(t, path, certs.EncodeCertificates(a.cert, b.cert))
	name := secretcache.FileRootPrefix + path

	f := newFixture(t, nil)
	ch := watch(t, f.m, name)
	r1 := mustSecret(t, f.m, name)
	if len(r1.Roots) != 2 || r1.Chain != nil || r1.Key != nil {
		t.Fatalf("first load: %+v", r1)
	}
	receive(t, ch, "first load")
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 1)

	next := certs.EncodeCertificates(c.cert, d.cert)
	// A writer that stopped in the middle of the last block.
	if err := os.WriteFile(path, next[:len(next)-100], 0o600); err != nil {
		t.Fatal(err)
	}
	f.logs.WaitForContaining(t, "file secret not reloaded", 1)
	if s := mustSecret(t, f.m, name); s.Version != r1.Version {
		t.Fatal("a half-written bundle replaced the last good one")
	}
	if v := testkit.Metric(t, f.reg, "meshid_agent_file_secret_failures_total"); v < 1 {
		t.Fatalf("file failures = %v", v)
	}
	writeFile(t, path, next)
	r2 := receive(t, ch, "complete bundle")
	if len(r2.Roots) != 2 || !r2.Roots[0].Equal(c.cert) || !r2.Roots[1].Equal(d.cert) {
		t.Fatal("pushed bundle is not the complete new one")
	}
}

func TestFileCertMismatchedKeyNotServed(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	p1, p2 := newPair(t, "one"), newPair(t, "two")
	writeFile(t, certPath, p1.certPEM)
	writeFile(t, keyPath, p1.keyPEM)
	name := secretcache.FileCertPrefix + certPath + "~" + keyPath

	f := newFixture(t, nil)
	ch := watch(t, f.m, name)
	v1 := mustSecret(t, f.m, name)
	receive(t, ch, "first load")
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 1)

	// The certificate is replaced first: it does not match the old key.
	writeFile(t, certPath, p2.certPEM)
	f.logs.WaitForContaining(t, "does not match the certificate", 1)
	if s := mustSecret(t, f.m, name); s.Version != v1.Version {
		t.Fatal("a certificate with a mismatched key was served")
	}
	// A truncated key is not served either.
	writeFile(t, keyPath, p2.keyPEM[:len(p2.keyPEM)/2])
	f.logs.WaitForContaining(t, "no PEM data", 1)
	if s := mustSecret(t, f.m, name); s.Version != v1.Version {
		t.Fatal("a truncated key was served")
	}
	if containsFold(f.logs.All(), string(p2.keyPEM[40:80])) {
		t.Fatal("key material in the logs")
	}
	writeFile(t, keyPath, p2.keyPEM)
	v2 := receive(t, ch, "matching pair")
	if !v2.Chain[0].Equal(p2.cert) || !certs.KeyMatches(v2.Chain[0].PublicKey, v2.Key) {
		t.Fatal("pushed pair does not match")
	}
}

func TestFileAppearsLater(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	name := secretcache.FileCertPrefix + certPath + "~" + keyPath
	f := newFixture(t, nil)
	_, err := f.m.Secret(context.Background(), name)
	if !errors.Is(err, secretcache.ErrUnknownResource) {
		t.Fatalf("Secret of missing files = %v, want ErrUnknownResource", err)
	}
	ch := watch(t, f.m, name)
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 1)
	p := newPair(t, "late")
	writeFile(t, keyPath, p.keyPEM)
	writeFile(t, certPath, p.certPEM)
	s := receive(t, ch, "files appearing")
	if !s.Chain[0].Equal(p.cert) {
		t.Fatal("wrong certificate")
	}
}

func TestFileRelativeName(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	p := newPair(t, "rel")
	writeFile(t, "root.pem", p.certPEM)
	f := newFixture(t, nil)
	s := mustSecret(t, f.m, secretcache.FileRootPrefix+"root.pem")
	if !s.Roots[0].Equal(p.cert) || s.Name != secretcache.FileRootPrefix+"root.pem" {
		t.Fatalf("relative file-root: %+v", s)
	}
}

// TestFileCertKeyInOtherDir: a file-cert whose key lives in another
// directory is watched in both; a new pair written cert first, key last is
// served once the key (an event in the key's directory only) matches.
func TestFileCertKeyInOtherDir(t *testing.T) {
	certDir, keyDir := t.TempDir(), t.TempDir()
	certPath, keyPath := filepath.Join(certDir, "cert.pem"), filepath.Join(keyDir, "key.pem")
	p1, p2 := newPair(t, "one"), newPair(t, "two")
	writeFile(t, certPath, p1.certPEM)
	writeFile(t, keyPath, p1.keyPEM)
	name := secretcache.FileCertPrefix + certPath + "~" + keyPath

	f := newFixture(t, nil)
	ch := watch(t, f.m, name)
	if v1 := mustSecret(t, f.m, name); !v1.Chain[0].Equal(p1.cert) {
		t.Fatal("first load does not hold the first pair")
	}
	receive(t, ch, "first load")
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 2)

	writeFile(t, certPath, p2.certPEM) // cert and key mismatch: not served
	writeFile(t, keyPath, p2.keyPEM)   // the key's directory: the pair matches again
	v2 := receive(t, ch, "new pair")
	if !v2.Chain[0].Equal(p2.cert) || !certs.KeyMatches(v2.Chain[0].PublicKey, v2.Key) {
		t.Fatal("push after the key was written does not hold the new pair")
	}
}

// A new pair written in place (cp, an editor: no rename, so the only
// events are on the files themselves), cert first and key last, is
// served once the key is written; whether the names are the files or
// symbolic links to files beside them, whose events carry the targets'
// names (a file-root through such a link too).
func TestFileCertKeyRewrittenInPlace(t *testing.T) {
	for _, layout := range []string{"files", "links"} {
		t.Run(layout, func(t *testing.T) {
			dir := t.TempDir()
			certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
			certFile, keyFile := certPath, keyPath // the files written
			if layout == "links" {
				certFile, keyFile = filepath.Join(dir, "cert-1.pem"), filepath.Join(dir, "key-1.pem")
				mustSymlink(t, "cert-1.pem", certPath)
				mustSymlink(t, "key-1.pem", keyPath)
			}
			p1, p2 := newPair(t, "one"), newPair(t, "two")
			writeFile(t, certFile, p1.certPEM)
			writeFile(t, keyFile, p1.keyPEM)
			name := secretcache.FileCertPrefix + certPath + "~" + keyPath
			// A file in another directory, written after the cert: once
			// its change is pushed, every event of the cert's write was
			// handled (one watcher, one queue of events).
			marker := filepath.Join(t.TempDir(), "marker.pem")
			writeFile(t, marker, newPair(t, "marker").certPEM)

			f := newFixture(t, nil)
			ch := watch(t, f.m, name)
			markerCh := watch(t, f.m, secretcache.FileRootPrefix+marker)
			if v1 := mustSecret(t, f.m, name); !v1.Chain[0].Equal(p1.cert) {
				t.Fatal("first load does not hold the first pair")
			}
			mustSecret(t, f.m, secretcache.FileRootPrefix+marker)
			receive(t, ch, "first load")
			receive(t, markerCh, "first load of the marker")
			f.run(t)
			f.logs.WaitForContaining(t, "watching directory", 2)

			var rootCh <-chan *secretcache.Secret // the cert as a file-root, through the link
			if layout == "links" {
				rootCh = watch(t, f.m, secretcache.FileRootPrefix+certPath)
				mustSecret(t, f.m, secretcache.FileRootPrefix+certPath)
				receive(t, rootCh, "first load of the root")
			}
			// In place, the cert too: a rename's temporary file would make
			// events of other names in the directory.
			if err := os.WriteFile(certFile, p2.certPEM, 0o600); err != nil { // the old key does not match it: not served
				t.Fatal(err)
			}
			writeFile(t, marker, newPair(t, "marker-2").certPEM)
			receive(t, markerCh, "marker changed")
			if rootCh != nil {
				if r := receive(t, rootCh, "root rewritten behind its link"); !r.Roots[0].Equal(p2.cert) {
					t.Fatal("pushed root is not the new one")
				}
			}
			if err := os.WriteFile(keyFile, p2.keyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
			v2 := receive(t, ch, "key rewritten in place")
			if !v2.Chain[0].Equal(p2.cert) || !certs.KeyMatches(v2.Chain[0].PublicKey, v2.Key) {
				t.Fatal("push after the key was rewritten does not hold the new pair")
			}
		})
	}
}
