package main

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// TestUsageExitCode: a wrong command line exits 2 with one line naming
// what is wrong; a command that runs and fails exits 1.
func TestUsageExitCode(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nope"}, cli.ExitUsage, `unknown command "nope"`},
		{[]string{"inspec"}, cli.ExitUsage, "did you mean inspect?"},
		{[]string{"inspect", "--nope"}, cli.ExitUsage, "unknown flag: --nope"},
		{[]string{"certs", "root"}, cli.ExitUsage, `required flag(s) "out" not set`},
		{[]string{"certs", "root", "--out", dir, "extra"}, cli.ExitUsage, `unknown command "extra"`},
		{[]string{"certs", "root", "--out", dir, "--ttl", "soon"}, cli.ExitUsage, "--ttl"},
		{[]string{"server", "--max-ttl", "x"}, cli.ExitUsage, "--max-ttl"},
		{[]string{"inspect", "-o", "yaml", dir}, cli.ExitUsage, "unknown output format"},
		{[]string{"certs", "status", "--admin-socket", dir + "/admin.sock", "-o", "text"}, cli.ExitUsage, `invalid argument "text" for "-o, --output" flag: unknown output format (want table or json)`},
		{[]string{"inspect", dir + "/nope.pem"}, cli.ExitError, "no such file"},
		// The load tool is a binary of its own, also for --help.
		{[]string{"bench", "--help"}, cli.ExitUsage, "the load tool is the binary meshid-bench"},
		{[]string{"bench", "ca"}, cli.ExitUsage, "make bench-binary"},
		// A state dir that holds no dev issuer (a typo): the command that
		// creates one, and no token that no CA trusts.
		{[]string{"dev", "token", "--state-dir", dir + "/typo"}, cli.ExitUsage, "`meshid dev --state-dir " + dir + "/typo` creates one"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errOut, code := meshidRun(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("exit %d, stderr %q; want %d and one line with %q", code, errOut, tc.code, tc.want)
			}
		})
	}
	if _, err := os.Stat(dir + "/typo"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("meshid dev token created its --state-dir: %v", err)
	}
	if out := meshidOK(t); !strings.Contains(out, "Available Commands") {
		t.Fatalf("meshid without arguments: %q", out)
	}
}
