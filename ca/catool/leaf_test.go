package catool_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/catool"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// TestLeaf: the minted leaf is an X509-SVID for the ID, signed by the CA
// directory's intermediate, verifying against its roots, for the TTL.
func TestLeaf(t *testing.T) {
	_, rootDir := root(t, catool.RootConfig{})
	fake := clock.NewFake(t0.Add(time.Hour))
	caDir := filepath.Join(t.TempDir(), "west")
	inter, err := catool.Intermediate(catool.IntermediateConfig{RootDir: rootDir, Dir: caDir, Name: "west", Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart")
	m, err := catool.Leaf(catool.LeafConfig{CADir: caDir, ID: id, TTL: 2 * time.Hour, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	got, err := certs.VerifySVID(m.Chain, id.TrustDomain(), m.Roots, fake.Now())
	if err != nil || got != id {
		t.Fatalf("VerifySVID: %v, %v", got, err)
	}
	if !m.Chain[1].Equal(inter) || m.Leaf.IsCA || !certs.KeyMatches(m.Leaf.PublicKey, m.Key) {
		t.Fatalf("chain[1] %q, CA %t", m.Chain[1].Subject, m.Leaf.IsCA)
	}
	if d := m.Leaf.NotAfter.Sub(fake.Now()); d != 2*time.Hour {
		t.Errorf("lifetime from now %v, want 2h", d)
	}
	for name, cfg := range map[string]catool.LeafConfig{
		"root-only dir": {CADir: rootDir, ID: id, Clock: fake},
		"no dir":        {CADir: filepath.Join(rootDir, "nope"), ID: id, Clock: fake},
		"no id":         {CADir: caDir, Clock: fake},
		"ttl over max":  {CADir: caDir, ID: id, TTL: 10000 * time.Hour, Clock: fake},
	} {
		if _, err := catool.Leaf(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestCreateKeyFile is the attacker's view of --out-key: every path that
// is not a new file in a directory only this user controls is refused,
// and nothing is written through it.
func TestCreateKeyFile(t *testing.T) {
	key := []byte("-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n")
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "key.pem")
	if err := catool.CreateKeyFile(good, key); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(good); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", st.Mode(), err)
	}

	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.pem")
	dangling := filepath.Join(dir, "dangling.pem")
	for _, l := range [][2]string{{target, link}, {filepath.Join(dir, "not-yet"), dangling}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	groupDir, worldDir := filepath.Join(dir, "group"), filepath.Join(dir, "world")
	for d, mode := range map[string]os.FileMode{groupDir: 0o770, worldDir: 0o1777} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	for name, p := range map[string]string{
		"existing file":      good,
		"symlink to a file":  link,
		"dangling symlink":   dangling,
		"directory":          sub,
		"group-writable dir": filepath.Join(groupDir, "key.pem"),
		"world-writable dir": filepath.Join(worldDir, "key.pem"),
		"missing parent":     filepath.Join(dir, "nope", "key.pem"),
		"parent is a file":   filepath.Join(target, "key.pem"),
	} {
		err := catool.CreateKeyFile(p, key)
		if err == nil {
			t.Errorf("%s: written", name)
			continue
		}
		if bytes.Contains([]byte(err.Error()), []byte("secret")) {
			t.Errorf("%s: error holds the key: %v", name, err)
		}
	}
	for _, p := range []string{target, filepath.Join(dir, "not-yet"), filepath.Join(groupDir, "key.pem"), filepath.Join(worldDir, "key.pem")} {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, key) {
			t.Errorf("%s holds the key", p)
		}
	}
	if err := catool.CreateKeyFile(link, key); !errors.Is(err, catool.ErrInsecureOutput) {
		t.Errorf("symlink: %v, want ErrInsecureOutput", err)
	}
}

// TestWriteLeafRefusedKeyWritesNothing: a refused --out-key leaves no
// certificate behind either, and standard output is refused for the key.
func TestWriteLeafRefusedKeyWritesNothing(t *testing.T) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(existing, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cert := filepath.Join(dir, "cert.pem")
	for _, k := range []string{existing, "-"} {
		err := catool.WriteLeaf(&catool.Minted{Key: key}, catool.LeafOutput{Cert: cert, Key: k, Stdout: &stdout})
		if !errors.Is(err, catool.ErrInsecureOutput) && (err == nil || !bytes.Contains([]byte(err.Error()), []byte("--force-insecure-output"))) {
			t.Fatalf("--out-key %s: %v", k, err)
		}
	}
	if _, err := os.Stat(cert); err == nil || stdout.Len() != 0 {
		t.Fatalf("something was written: cert %v, stdout %q", err, stdout.String())
	}
}
