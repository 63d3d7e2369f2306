package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/testkit"
)

// The rotation commands drive a running CA through its admin socket:
// rotate-root prepares a new root, status shows both roots, activate makes
// it sign, and a second activate says there is nothing to do.
func TestCertsRotateRootActivate(t *testing.T) {
	sock := filepath.Join(testkit.ShortDir(t), "admin.sock")
	s := testkit.CA(t, caserver.Config{AdminSocket: sock})
	testkit.WaitForSocket(t, sock)
	old := s.Authority().Bundle().Cert

	out := meshidOK(t, "certs", "rotate-root", "--admin-socket", sock)
	if !strings.Contains(out, "phase:     prepared") || !strings.Contains(out, "bundle:    2 root(s)") {
		t.Fatalf("rotate-root printed:\n%s", out)
	}
	var st admin.Status
	if err := json.Unmarshal([]byte(meshidOK(t, "certs", "status", "--admin-socket", sock, "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Phase != "prepared" || st.NextStep != "activate" || len(st.Roots) != 2 || st.Roots[1].State != "next" {
		t.Fatalf("status: %+v", st)
	}
	if !s.Authority().Bundle().Cert.Equal(old) {
		t.Fatal("the new root signs before activation")
	}
	// inspect --ca reads the same state: phase, both roots, the next step.
	out = meshidOK(t, "inspect", "--ca", sock)
	if !strings.Contains(out, "phase:     prepared") || !strings.Contains(out, "bundle:    2 root(s)") {
		t.Fatalf("inspect --ca printed:\n%s", out)
	}
	var ist admin.Status
	if err := json.Unmarshal([]byte(meshidOK(t, "inspect", "--ca", sock, "-o", "json")), &ist); err != nil || ist.Phase != "prepared" || len(ist.Roots) != 2 {
		t.Fatalf("inspect --ca -o json: %+v, %v", ist, err)
	}
	if _, stderr, code := meshidRun(t, nil, "inspect", "--ca", sock, "--sds", sock); code != 2 || !strings.Contains(stderr, "give it alone") {
		t.Fatalf("inspect --ca with --sds: exit %d, %q", code, stderr)
	}
	out = meshidOK(t, "certs", "activate", "--admin-socket", sock)
	if !strings.Contains(out, "phase:     active") || s.Authority().Bundle().Cert.Equal(old) {
		t.Fatalf("activate printed:\n%s", out)
	}
	if _, stderr, code := meshidRun(t, nil, "certs", "activate", "--admin-socket", sock); code == 0 || !strings.Contains(stderr, "no CA is prepared") {
		t.Fatalf("second activate: exit %d, %q", code, stderr)
	}
	if _, stderr, code := meshidRun(t, nil, "certs", "status"); code == 0 || !strings.Contains(stderr, "admin-socket") {
		t.Fatalf("status without --admin-socket: exit %d, %q", code, stderr)
	}
}

func TestServerRotationFlags(t *testing.T) {
	clearServerEnv(t)
	cfg := serverConfigOf(t)
	if cfg.Rotation.Propagation != 10*time.Minute || cfg.Rotation.RootThreshold != 365*24*time.Hour || cfg.AdminSocket != "" {
		t.Fatalf("defaults: %v %v %q", cfg.Rotation.Propagation, cfg.Rotation.RootThreshold, cfg.AdminSocket)
	}
	cfg = serverConfigOf(t, "--rotation-propagation", "3m", "--root-rotation-threshold", "-1s", "--admin-socket", "/run/meshid/admin.sock")
	if cfg.Rotation.Propagation != 3*time.Minute || cfg.Rotation.RootThreshold != -time.Second || cfg.AdminSocket != "/run/meshid/admin.sock" {
		t.Fatalf("flags: %v %v %q", cfg.Rotation.Propagation, cfg.Rotation.RootThreshold, cfg.AdminSocket)
	}
}
