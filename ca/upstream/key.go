package upstream

import (
	"crypto"

	"github.com/meshid/meshid/certs"
)

// KeySource makes the key of each new intermediate: every mint asks for a
// new one, so that a renewal never reuses a key. SoftwareKeys keeps it in
// memory (saved with the certificate); ModuleKeys creates it in a PKCS#11
// module.
type KeySource interface {
	// NewKey makes a new key pair of type kt. id finds it again after a
	// restart (ModuleKeys.Load); nil for a key that only lives in memory.
	NewKey(kt certs.KeyType) (key crypto.Signer, id []byte, err error)
}

// Destroyer is a key that can be erased from where it is kept: a mint
// that fails or is refused destroys the key made for it. A software key
// is not one (it goes with the memory).
type Destroyer interface {
	Destroy() error
}

// SoftwareKeys makes keys in memory with certs.GenerateKey.
type SoftwareKeys struct{}

// NewKey generates a key of type kt; its id is nil.
func (SoftwareKeys) NewKey(kt certs.KeyType) (crypto.Signer, []byte, error) {
	k, err := certs.GenerateKey(kt)
	return k, nil, err
}
