//go:build cgo

package upstream_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/keystore/pkcs11/softhsm"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

func moduleKeys(t *testing.T) (*upstream.ModuleKeys, *pkcs11.URI) {
	t.Helper()
	tk := softhsm.New(t)
	u, err := pkcs11.ParseURI(tk.URI("meshid-upstream"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := upstream.NewModuleKeys(upstream.ModuleKeysConfig{URI: u})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, u
}

func listKeys(t *testing.T, u *pkcs11.URI) []pkcs11.KeyInfo {
	t.Helper()
	ks, err := pkcs11.List(pkcs11.Config{URI: u})
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestModuleKeys (real SoftHSM2): each NewKey is a new sensitive,
// non-extractable key pair with the URI's label and its own id; Collect
// never destroys a key made for a mint still in progress, destroys a key
// that signed once it no longer does, and Load finds a key by its id.
func TestModuleKeys(t *testing.T) {
	m, u := moduleKeys(t)
	k1, id1, err := m.NewKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	k2, id2, err := m.NewKey(certs.ECP384)
	if err != nil {
		t.Fatal(err)
	}
	if len(id1) != upstream.KeyIDSize || bytes.Equal(id1, id2) {
		t.Fatalf("ids %x and %x: want two different ids of %d bytes", id1, id2, upstream.KeyIDSize)
	}
	ks := listKeys(t, u)
	if len(ks) != 2 {
		t.Fatalf("%d keys in the token, want 2", len(ks))
	}
	for _, k := range ks {
		if k.Label != "meshid-upstream" || !k.Sensitive || k.Extractable {
			t.Fatalf("key %x: label %q sensitive %v extractable %v", k.ID, k.Label, k.Sensitive, k.Extractable)
		}
	}
	// k2 is a mint in progress: it never signed, so it is not destroyed.
	if d := m.Collect([]crypto.PublicKey{k1.Public()}, nil); len(d) != 0 {
		t.Fatalf("destroyed %x while k1 signs and k2 is being minted", d)
	}
	// k2 named by the state only: k1 no longer signs and goes.
	if d := m.Collect(nil, [][]byte{id2}); len(d) != 1 || !bytes.Equal(d[0], id1) {
		t.Fatalf("destroyed %x, want k1's id %x", d, id1)
	}
	if ks := listKeys(t, u); len(ks) != 1 || !bytes.Equal(ks[0].ID, id2) {
		t.Fatalf("keys left %+v, want k2 only", ks)
	}
	if got, ok := m.ID(k2); !ok || !bytes.Equal(got, id2) {
		t.Fatalf("ID(k2) = %x %v", got, ok)
	}
	if _, ok := m.ID(testkit.Key(t, certs.ECP256)); ok {
		t.Fatal("ID of a software key")
	}
	// A restart: another ModuleKeys loads k2 by its id; a destroyed id is
	// not found.
	m2, err := upstream.NewModuleKeys(upstream.ModuleKeysConfig{URI: u})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	k, err := m2.Load(id2)
	if err != nil || !certs.KeyMatches(k2.Public(), k) {
		t.Fatalf("Load(k2): %v", err)
	}
	if _, err := m2.Load(id1); err == nil || !strings.Contains(err.Error(), "holds no key pair") {
		t.Fatalf("Load of a destroyed key: %v", err)
	}
	for _, bad := range []pkcs11.URI{{Token: "meshid", ID: []byte{1}}, {Token: "meshid", Object: "a", ID: []byte{1}}} {
		if _, err := upstream.NewModuleKeys(upstream.ModuleKeysConfig{URI: &bad}); err == nil || !strings.Contains(err.Error(), "no id=") {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}

// answer is a test upstream (the unit's fake; caserver's tests use the
// real cfssl) that returns err, or a chain that is not for the key asked.
type answer struct {
	err  error
	root *x509.Certificate
}

func (a answer) MintX509CA(context.Context, []byte, time.Duration) (*upstream.Minted, error) {
	if a.err != nil {
		return nil, a.err
	}
	return &upstream.Minted{Chain: []*x509.Certificate{a.root}, Roots: []*x509.Certificate{a.root}}, nil
}

// TestMintDestroysTheKeyOfAFailedMint (real SoftHSM2): a mint the
// upstream fails, or whose answer is refused, leaves no key in the module.
func TestMintDestroysTheKeyOfAFailedMint(t *testing.T) {
	m, u := moduleKeys(t)
	root, _ := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "not for our key"}, TTL: time.Hour, MaxPathLen: -1})
	for _, a := range []answer{{err: errors.New("connection refused")}, {root: root}} {
		r, err := upstream.NewRenewer(upstream.RenewerConfig{
			Upstream: a, TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), Keys: m,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Mint(context.Background()); err == nil {
			t.Fatal("minted")
		}
		if ks := listKeys(t, u); len(ks) != 0 {
			t.Fatalf("after a failed mint (%v) the module holds %d keys", a.err, len(ks))
		}
	}
}
