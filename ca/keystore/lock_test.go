package keystore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// helperEnv makes the test binary act as a `meshid server` start-up: it runs
// LoadOrCreateSelfSigned on the named state directory and prints the root's
// fingerprint.
const helperEnv = "MESHID_KEYSTORE_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: dir, TrustDomain: "cluster.local"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(fingerprint(b))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func fingerprint(b *keystore.Bundle) string {
	sum := sha256.Sum256(b.Cert.Raw)
	return hex.EncodeToString(sum[:])
}

// checkOneRoot asserts that every start-up got the same root and that the
// state directory holds a key and certificates of that one root.
func checkOneRoot(t *testing.T, dir string, got []string) {
	t.Helper()
	for _, fp := range got[1:] {
		if fp != got[0] {
			t.Fatalf("two start-ups on one state directory got different roots: %v", got)
		}
	}
	b, err := keystore.LoadDir(dir, clock.Real{}.Now())
	if err != nil {
		t.Fatalf("state directory left inconsistent: %v", err)
	}
	if fingerprint(b) != got[0] {
		t.Fatalf("state directory holds root %s, start-ups use %s", fingerprint(b), got[0])
	}
	if !certs.KeyMatches(b.Cert.PublicKey, b.Key) {
		t.Fatal("ca-key.pem does not match ca-cert.pem")
	}
}

// TestLoadOrCreateSelfSignedConcurrent reproduces hole 11: two servers
// starting at once on a fresh state directory each created a root and the
// files on disk mixed them. Repeated, because the race is timing-dependent.
func TestLoadOrCreateSelfSignedConcurrent(t *testing.T) {
	for i := range 20 {
		dir := filepath.Join(t.TempDir(), "state")
		got := make([]string, 2)
		var wg sync.WaitGroup
		for j := range got {
			wg.Go(func() {
				b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: dir, TrustDomain: "cluster.local"})
				if err != nil {
					t.Errorf("run %d: %v", i, err)
					return
				}
				got[j] = fingerprint(b)
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		checkOneRoot(t, dir, got)
	}
}

// TestLoadOrCreateSelfSignedTwoProcesses is the same race with two real
// processes, as two `meshid server` on one --state-dir.
func TestLoadOrCreateSelfSignedTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		dir := filepath.Join(t.TempDir(), "state")
		cmds := make([]*exec.Cmd, 2)
		outs := make([]*os.File, 2)
		for j := range cmds {
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			outs[j] = out
			cmds[j] = exec.Command(exe)
			cmds[j].Env = append(os.Environ(), helperEnv+"="+dir)
			cmds[j].Stdout, cmds[j].Stderr = out, out
		}
		for _, c := range cmds {
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
		}
		got := make([]string, 2)
		for j, c := range cmds {
			err := c.Wait()
			data, _ := os.ReadFile(outs[j].Name())
			outs[j].Close()
			if err != nil {
				t.Fatalf("run %d process %d: %v: %s", i, j, err, data)
			}
			got[j] = string(data)
		}
		checkOneRoot(t, dir, got)
	}
}
