//go:build !unix

package keystore

// lockDir is a no-op where flock does not exist: meshid's CA runs on Linux.
func lockDir(string) (func(), error) { return func() {}, nil }
