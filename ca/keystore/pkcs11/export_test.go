//go:build cgo

package pkcs11

import (
	"crypto"

	"github.com/meshid/meshid/internal/clock"
)

// SetClock replaces k's clock.
func SetClock(k *Key, c clock.Clock) { k.cfg.Clock = c }

// SetModuleSign replaces the module call that Sign makes.
func SetModuleSign(k *Key, f func(s crypto.Signer, digest []byte, opts crypto.SignerOpts) ([]byte, error)) {
	k.sign = f
}

// Reopened counts k's successful reopens.
func Reopened(k *Key) int64 { return k.reopened.Load() }
