//go:build !cgo

package pkcs11

import (
	"crypto"
	"errors"
	"io"

	"github.com/meshid/meshid/certs"
)

// ErrNoCgo is returned by New and Generate in a binary built with
// CGO_ENABLED=0, which cannot load a PKCS#11 module.
var ErrNoCgo = errors.New("pkcs11: this meshid binary was built without cgo (CGO_ENABLED=0) and cannot load PKCS#11 modules; use a build with cgo for a pkcs11: key")

// Key is a private key held in a PKCS#11 module. Without cgo none can be
// opened.
type Key struct{}

// New fails: see ErrNoCgo.
func New(Config) (*Key, error) { return nil, ErrNoCgo }

// Generate fails: see ErrNoCgo.
func Generate(Config, certs.KeyType) (*Key, error) { return nil, ErrNoCgo }

func (*Key) Public() crypto.PublicKey { return nil }

func (*Key) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) { return nil, ErrNoCgo }

func (*Key) Close() error { return nil }

func (*Key) String() string { return "pkcs11 key (unsupported without cgo)" }
