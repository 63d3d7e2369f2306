package certs_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/certs"
)

// TestWriteFileAtomicSyncsDirectory checks the durability order: the
// directory is fsynced after the rename (the new file is already in place
// when it is), and a failed directory fsync is reported, because until it
// succeeds a power loss may undo the rename.
func TestWriteFileAtomicSyncsDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ca-key.pem")
	var synced []string
	restore := certs.SetSyncDir(func(d string) error {
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, []byte("new")) {
			t.Errorf("directory synced before the rename: %q %v", got, err)
		}
		synced = append(synced, d)
		return certs.SyncDir(d) // the real fsync still runs
	})
	defer restore()

	if err := certs.WriteFileAtomic(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 1 || synced[0] != dir {
		t.Fatalf("directory fsyncs = %q, want exactly [%q]", synced, dir)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", st, err)
	}

	certs.SetSyncDir(func(string) error { return errors.New("EIO") })
	err := certs.WriteFileAtomic(path, []byte("newer"), 0o600)
	if err == nil || !strings.Contains(err.Error(), "sync directory") {
		t.Fatalf("err = %v, want the directory fsync failure", err)
	}
}

func TestSyncDirRealDirectory(t *testing.T) {
	if err := certs.SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := certs.SyncDir(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("syncing a missing directory succeeded")
	}
}
