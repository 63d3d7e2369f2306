//go:build !cgo

package pkcs11_test

import (
	"errors"
	"testing"

	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/certs"
)

// TestNoCgoRefuses: a CGO_ENABLED=0 build still parses URIs but refuses to
// open or create a module key, saying why.
func TestNoCgoRefuses(t *testing.T) {
	u, err := pkcs11.ParseURI("pkcs11:token=t;object=k?module-path=/m.so&pin-source=/pin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pkcs11.New(pkcs11.Config{URI: u}); !errors.Is(err, pkcs11.ErrNoCgo) {
		t.Fatalf("New: %v, want ErrNoCgo", err)
	}
	if _, err := pkcs11.Generate(pkcs11.Config{URI: u}, certs.ECP256); !errors.Is(err, pkcs11.ErrNoCgo) {
		t.Fatalf("Generate: %v, want ErrNoCgo", err)
	}
}
