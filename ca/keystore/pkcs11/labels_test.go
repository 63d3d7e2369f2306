//go:build cgo

package pkcs11_test

import (
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/keystore/pkcs11/softhsm"
	"github.com/meshid/meshid/certs"
)

// Two key pairs under one label (and different ids): New refuses to guess
// which signs, naming how many it found, and Generate refuses to add a
// third under that label.
func TestTwoKeyPairsUnderOneLabel(t *testing.T) {
	tk := softhsm.New(t)
	withID := func(id string) string { return strings.Replace(tk.URI("ca"), "object=ca", "object=ca;id="+id, 1) }
	for _, id := range []string{"%01", "%02"} {
		k, err := pkcs11.Generate(pkcs11.Config{URI: mustURI(t, withID(id))}, certs.ECP256)
		if err != nil {
			t.Fatal(err)
		}
		k.Close()
	}
	const want = "holds 2 key pairs"
	if _, err := pkcs11.New(pkcs11.Config{URI: mustURI(t, tk.URI("ca"))}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("New with two key pairs under the label: %v, want %q", err, want)
	}
	if k, err := pkcs11.Generate(pkcs11.Config{URI: mustURI(t, tk.URI("ca"))}, certs.ECP256); err == nil || !strings.Contains(err.Error(), want) {
		if k != nil {
			k.Close()
		}
		t.Fatalf("Generate under a label with two key pairs: %v, want %q", err, want)
	}
	// Still two: the refused Generate made nothing.
	if _, err := pkcs11.New(pkcs11.Config{URI: mustURI(t, tk.URI("ca"))}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("after the refused Generate: %v, want %q", err, want)
	}
	// An id picks one.
	k, err := pkcs11.New(pkcs11.Config{URI: mustURI(t, withID("%02"))})
	if err != nil {
		t.Fatal(err)
	}
	k.Close()
}
