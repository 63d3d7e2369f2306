package agentflood_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"

	"github.com/meshid/meshid/bench/agentflood"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/testkit"
)

// Run against the agent assembly (certificates from an in-process CA, no
// JWT signer, so every FetchJWTSVID is Unavailable): the calls and streams
// are counted by code (1,024 streams held on one connection, the rest
// refused or cut off), the huge header's connection is closed, and the
// samples read RSS, goroutines and a CA counter.
func TestRun(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	dir := testkit.ShortDir(t)
	cfg := agent.Config{
		Signer:            testkit.AuthoritySigner{Authority: testkit.NewAuthority(t, td, nil, nil), Caller: "test"},
		Namespace:         "bench",
		ServiceAccount:    "flood",
		SDSSocket:         filepath.Join(dir, "sds.sock"),
		WorkloadAPISocket: filepath.Join(dir, "wl.sock"),
		Registerer:        prometheus.NewRegistry(),
	}
	testkit.RunAgent(t, cfg)
	pages := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "pprof") {
			fmt.Fprint(w, "goroutine profile: total 42\n")
			return
		}
		fmt.Fprint(w, "# TYPE meshid_ca_jwtsvid_issued_total counter\nmeshid_ca_jwtsvid_issued_total 7\n")
	}))
	defer pages.Close()
	rep, err := agentflood.Run(t.Context(), agentflood.Config{
		WorkloadSocket: cfg.WorkloadAPISocket, JWTCalls: 20, JWTConcurrency: 4, JWTDeadline: testkit.Guard,
		SDSSocket: cfg.SDSSocket, HeaderStreams: 1, HeaderSize: 1 << 20, Streams: 1100,
		AgentPID: os.Getpid(), GoroutinesURL: pages.URL + "/debug/pprof/goroutine", CAMetricsURL: pages.URL + "/metrics",
		Settle: time.Nanosecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.JWTCodes[codes.Unavailable] != 20 {
		t.Errorf("JWT codes %v, want 20 Unavailable", rep.JWTCodes)
	}
	if ok := rep.SDSCodes[codes.OK]; ok != 1024 || rep.SDSCodes[codes.Unavailable] < 1 {
		t.Errorf("SDS codes %v, want 1,024 OK and the huge header's connection closed", rep.SDSCodes)
	}
	if s := rep.Settled; s.RSS <= 0 || s.Goroutines != 42 || s.CAMints != 7 {
		t.Errorf("sample %+v", s)
	}
	var b strings.Builder
	rep.Format(&b)
	if !strings.Contains(b.String(), "RSS MiB") {
		t.Errorf("table:\n%s", b.String())
	}
}
