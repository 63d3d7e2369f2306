package caserver_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/testkit"
)

var exampleTD = spiffeid.RequireTrustDomainFromString("example.org")

// startCA runs the assembled CA with cfg until stop (or the test's end).
func startCA(t *testing.T, cfg caserver.Config) (*caserver.Server, func()) {
	t.Helper()
	cfg.Registerer = prometheus.NewRegistry()
	s, err := caserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	stop := testkit.Start(t, "CA", s.Run)
	t.Cleanup(stop)
	return s, stop
}

// pluggedCA writes a new self-signed CA into dir (Istio's cacerts files).
func pluggedCA(t *testing.T, dir string) *keystore.Bundle {
	t.Helper()
	b, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: exampleTD.Name()})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// A meshid server on a plugged --ca-dir restarted mid-rotation, after the
// files were replaced, keeps the old root in the bundle: while prepared
// (the new CA must sign: the old key is gone) until RetireAfter from the
// restart, while active until the retirement time saved before it.
func TestPluggedCARestartKeepsTheOldRoot(t *testing.T) {
	for _, activate := range []bool{false, true} {
		name := map[bool]string{false: "prepared", true: "active"}[activate]
		t.Run(name, func(t *testing.T) {
			dir, state := t.TempDir(), t.TempDir()
			first := pluggedCA(t, dir)
			cfg := caserver.Config{TrustDomain: exampleTD, CADir: dir, StateDir: state}
			s, stop := startCA(t, cfg)
			second := pluggedCA(t, dir) // the operator replaces the files
			if err := s.Rotation().SetBundle(second); err != nil {
				t.Fatal(err)
			}
			if activate {
				if err := s.Rotation().Activate(); err != nil {
					t.Fatal(err)
				}
			}
			before := s.Rotation().Status()
			stop()
			if st, err := os.Stat(filepath.Join(state, "rotation.json")); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("rotation.json: %v, %v; want mode 0600", st, err)
			}

			restart := time.Now()
			again, _ := startCA(t, cfg)
			st := again.Rotation().Status()
			roots := again.Authority().Bundle().Roots
			if !st.Signing.Equal(second.Cert) || len(roots) != 2 || !slices.ContainsFunc(roots, first.Cert.Equal) {
				t.Fatalf("after the restart: signing %q, %d roots; want the new CA with the old root kept", st.Signing.Subject, len(roots))
			}
			retireAfter := caserver.DefaultMaxTTL + ca.DefaultClockSkew
			switch {
			case st.Phase != rotation.Active || st.NextStep != "retire":
				t.Fatalf("restored %v, next %q", st.Phase, st.NextStep)
			case activate && !st.NextStepAt.Equal(before.NextStepAt):
				t.Fatalf("retire at %v, want the saved %v", st.NextStepAt, before.NextStepAt)
			case !activate && st.NextStepAt.Before(restart.Add(retireAfter)):
				t.Fatalf("retire at %v, before RetireAfter from the restart %v", st.NextStepAt, restart.Add(retireAfter))
			}
		})
	}
}

// A rotation.json that cannot be vouched for (not JSON, writable by
// others, a symbolic link) is refused with the file named, moved aside to
// rotation.json.refused, and the CA serves on its files.
func TestRotationStateFileRefused(t *testing.T) {
	for name, plant := range map[string]func(path string) error{
		"garbage": func(path string) error { return os.WriteFile(path, []byte("{not json"), 0o600) },
		"world writable": func(path string) error {
			if err := os.WriteFile(path, []byte(`{"version":1}`), 0o600); err != nil {
				return err
			}
			return os.Chmod(path, 0o666)
		},
		"symlink": func(path string) error {
			target := filepath.Join(filepath.Dir(path), "elsewhere.json")
			if err := os.WriteFile(target, []byte(`{}`), 0o600); err != nil {
				return err
			}
			return os.Symlink(target, path)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir, state := t.TempDir(), t.TempDir()
			first := pluggedCA(t, dir)
			path := filepath.Join(state, "rotation.json")
			if err := plant(path); err != nil {
				t.Fatal(err)
			}
			logs := testkit.NewLogRecorder()
			s, stop := startCA(t, caserver.Config{TrustDomain: exampleTD, CADir: dir, StateDir: state, Logger: logs.Logger()})
			if n := logs.CountContaining("rotation state is refused"); n != 1 {
				t.Fatalf("%d refusal logs, want 1:\n%s", n, logs.All())
			}
			if !s.Authority().Bundle().Cert.Equal(first.Cert) {
				t.Fatal("the CA does not sign with its files")
			}
			if st := s.Rotation().Status().Stuck; !strings.Contains(st, "rotation") {
				t.Fatalf("stuck %q, want the refusal", st)
			}
			if _, err := os.Lstat(path + ".refused"); err != nil {
				t.Fatalf("the refused file was not moved aside: %v", err)
			}
			stop() // saves a fresh state in place of the refused one
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var rec rotation.Record
			if err := json.Unmarshal(data, &rec); err != nil || rec.Phase != "stable" {
				t.Fatalf("state after the refusal: %v %q", err, data)
			}
			if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
				t.Fatalf("rotation.json after the refusal: %v %v", st, err)
			}
		})
	}
}

// The self-signed root restarted while retiring its old root keeps it only
// until the saved retirement time: root-cert.pem's union does not make the
// old root a current one.
func TestSelfSignedRestartRetiresOnTime(t *testing.T) {
	dir := t.TempDir()
	cfg := caserver.Config{StateDir: dir}
	s, stop := startCA(t, cfg)
	if err := s.Rotation().RotateRoot(); err != nil {
		t.Fatal(err)
	}
	if err := s.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	before := s.Rotation().Status()
	stop()
	again, _ := startCA(t, cfg)
	st := again.Rotation().Status()
	if st.Phase != rotation.Active || st.NextStep != "retire" || !st.NextStepAt.Equal(before.NextStepAt) || len(st.Roots) != 2 {
		t.Fatalf("after the restart: %v, next %q at %v (want retire at %v), %d roots", st.Phase, st.NextStep, st.NextStepAt, before.NextStepAt, len(st.Roots))
	}
	if strings.Contains(st.Stuck, "refused") {
		t.Fatalf("stuck %q", st.Stuck)
	}
}
