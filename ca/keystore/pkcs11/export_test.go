//go:build cgo

package pkcs11

import "time"

// SetNow replaces k's clock.
func SetNow(k *Key, now func() time.Time) { k.now = now }

// Reopened counts k's successful reopens.
func Reopened(k *Key) int64 { return k.reopened.Load() }
