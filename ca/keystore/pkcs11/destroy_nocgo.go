//go:build !cgo

package pkcs11

import "crypto"

// Destroy fails: see ErrNoCgo.
func (*Key) Destroy() error { return ErrNoCgo }

// KeyInfo describes a key pair found in a token by List.
type KeyInfo struct {
	ID                     []byte
	Label                  string
	Public                 crypto.PublicKey
	Sensitive, Extractable bool
}

// List fails: see ErrNoCgo.
func List(Config) ([]KeyInfo, error) { return nil, ErrNoCgo }
