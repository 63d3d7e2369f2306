package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/meshid/meshid/inspect"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretdump"
)

// TestInspectAgentDump: what --pod reads (a real agent's /debug/secrets)
// gives the same rows as --sds on the same agent, without the key; the
// port-forward part is tested against the real API server in test/kube.
func TestInspectAgentDump(t *testing.T) {
	a, _ := runCLIAgent(t, func(c *agent.Config) { c.MonitoringListen = "127.0.0.1:0" })
	sdsOut := meshidOK(t, "inspect", "--sds", a.SocketPath())
	get := func(ctx context.Context) ([]byte, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.MonitoringAddr().String()+secretdump.Path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return io.ReadAll(resp.Body)
	}
	var out bytes.Buffer
	rep, err := inspect.Run(context.Background(), inspect.Config{
		Sources: []inspect.Source{inspect.AgentDump("pod default/x", get)},
		Options: inspect.Options{Now: cliNow},
		Out:     &out,
	})
	if err != nil || rep.Err() != nil {
		t.Fatalf("%v %v\n%s", err, rep.Err(), out.String())
	}
	// The same table; only the SDS view, which holds the key, confirms it.
	if want, _, _ := strings.Cut(sdsOut, "\ndefault: private key"); out.String() != want {
		t.Fatalf("--pod view differs from --sds:\n%s\nvs\n%s", out.String(), sdsOut)
	}
	if rep.Results[0].PrivateKey != nil || strings.Contains(out.String(), "PRIVATE KEY") {
		t.Fatal("a key in the --pod view")
	}

	// An agent that holds nothing says why, and inspect shows it.
	notReady := func(context.Context) ([]byte, error) {
		return []byte(`{"identity":"spiffe://cluster.local/ns/a/sa/b","ready":false,"reason":"not ready: no workload certificate yet; last CA failure: rpc error: code = Unauthenticated desc = token expired","secrets":[]}`), nil
	}
	_, err = inspect.Run(context.Background(), inspect.Config{Sources: []inspect.Source{inspect.AgentDump("pod a/b", notReady)}, Out: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "pod a/b (spiffe://cluster.local/ns/a/sa/b) is not ready") || !strings.Contains(err.Error(), "token expired") {
		t.Fatalf("not-ready agent: %v", err)
	}

	// --pod's own usage errors.
	for _, bad := range []string{"cart", "shop/", "/cart", "a/b/c"} {
		_, errOut, code := meshidRun(t, nil, "inspect", "--pod", bad)
		if code != 2 || !strings.Contains(errOut, "want NAMESPACE/NAME") {
			t.Errorf("--pod %q: exit %d %q", bad, code, errOut)
		}
	}
}
