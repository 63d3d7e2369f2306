package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// A CA address in use (another meshid dev or server) stops `meshid server`
// and `meshid dev` before any log line that looks like a start, with the
// flag that changes it; neither writes its state dir.
func TestListenInUse(t *testing.T) {
	clearServerEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"server", "--state-dir", filepath.Join(dir, "server"), "--listen", addr, "--monitoring-listen", ""},
		{"dev", "--state-dir", filepath.Join(dir, "dev"), "--listen", addr, "--monitoring-listen", "", "--agent-monitoring-listen", ""},
	} {
		t.Run(args[0], func(t *testing.T) {
			out, errOut, code := meshidRun(t, nil, args...)
			want := "--listen " + addr + ": the address is in use"
			if code != cli.ExitError || !strings.Contains(errOut, want) || !strings.Contains(errOut, "choose another address with --listen") {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, want)
			}
			if strings.Count(errOut, "\n") != 1 || out != "" {
				t.Fatalf("lines before the refusal: stdout %q, stderr %q", out, errOut)
			}
		})
	}
	for _, cmd := range []string{"server", "dev"} {
		if _, err := os.Stat(filepath.Join(dir, cmd)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("meshid %s wrote its state dir before refusing: %v", cmd, err)
		}
	}
}

// A --ca-dir holding only a root (which signs intermediates, not
// workloads) is refused with the command that makes an intermediate, and
// nothing is written into --state-dir (no JWT keys, no federation state).
func TestCADirRootOnlyWritesNothing(t *testing.T) {
	clearServerEnv(t)
	dir := t.TempDir()
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	meshidOK(t, "certs", "root", "--out", root)
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := meshidRun(t, nil, "server", "--ca-dir", root, "--state-dir", state, "--listen", "127.0.0.1:0", "--monitoring-listen", "")
	if code != cli.ExitError || !strings.Contains(errOut, "meshid certs intermediate --root "+root) {
		t.Fatalf("exit %d, stderr %q; want 1 and the certs intermediate command", code, errOut)
	}
	if entries, err := os.ReadDir(state); err != nil || len(entries) != 0 {
		t.Fatalf("--state-dir after the refusal: %v %v, want empty", entries, err)
	}
}
