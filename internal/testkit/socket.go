package testkit

import (
	"os"
	"testing"
)

// ShortDir returns a new directory with a short path, removed when the test
// ends: a Unix socket path holds at most 107 bytes, and t.TempDir() paths
// carry the test's name.
func ShortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "meshid")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
