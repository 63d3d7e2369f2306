package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/testkit"
)

// TestInspectWorkloadAPI: `meshid inspect --workload-api` reads the agent
// assembly's Workload API and prints the same table (and JSON) as --sds.
func TestInspectWorkloadAPI(t *testing.T) {
	sock := filepath.Join(testkit.ShortDir(t), "wl.sock")
	runCLIAgent(t, func(c *agent.Config) { c.WorkloadAPISocket = sock })
	out := meshidOK(t, "inspect", "--workload-api", sock)
	table, notes, _ := strings.Cut(strings.TrimSpace(out), "\n\n")
	lines := strings.Split(table, "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "RESOURCE") {
		t.Fatalf("want a header and two rows:\n%s", out)
	}
	// The SVID's key, fetched with it, is confirmed under the table.
	if !strings.Contains(notes, "svid: private key (ec-p256, from svid) matches") {
		t.Fatalf("no key confirmation under the table:\n%s", out)
	}
	for i, want := range [][]string{{"svid", "Cert Chain", "true", testWorkload, "12h0m"}, {"bundle:cluster.local", "CA", "true"}} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %d lacks %q: %s", i+1, w, lines[i+1])
			}
		}
	}
	var rep any
	if err := json.Unmarshal([]byte(meshidOK(t, "inspect", "--workload-api", sock, "-o", "json")), &rep); err != nil {
		t.Fatalf("-o json: %v", err)
	}
	_, errOut, code := meshidRun(t, nil, "inspect", "--workload-api", filepath.Join(t.TempDir(), "none.sock"), "--timeout", "500ms")
	if code != 1 || !strings.Contains(errOut, "Workload API") {
		t.Errorf("absent socket: exit %d, stderr %q", code, errOut)
	}
}

// Each socket given to the other flag is recognised, and the error says
// which kind of socket it is and the flag that reads it.
func TestInspectWrongSocketKind(t *testing.T) {
	wl := filepath.Join(testkit.ShortDir(t), "wl.sock")
	a, _ := runCLIAgent(t, func(c *agent.Config) { c.WorkloadAPISocket = wl })
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workload-api", a.SocketPath()}, "not a SPIFFE Workload API server: this is an SDS socket (Envoy's secret discovery): read it with --sds"},
		{[]string{"--sds", wl}, "not an SDS server: this is a SPIFFE Workload API socket: read it with --workload-api"},
	} {
		_, errOut, code := meshidRun(t, nil, append([]string{"inspect", "--timeout", "1m"}, tc.args...)...)
		if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}
