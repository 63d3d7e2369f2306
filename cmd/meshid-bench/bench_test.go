package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/testkit"
)

// benchRun runs `meshid-bench` with args and returns its output and error.
func benchRun(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newBenchCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestBenchCAFlagErrors(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("not-a-jwt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no token", nil, "a token is needed"},
		{"both token sources", []string{"--token-file", tokenFile, "--dev-state-dir", dir}, "exclude each other"},
		{"not a dev state dir", []string{"--dev-state-dir", dir}, "is not the state directory of meshid dev"},
		{"unreadable token", []string{"--token-file", tokenFile, "--ca-root", tokenFile}, "bench ca: " + tokenFile},
		{"service accounts need dev", []string{"--token-file", tokenFile, "--service-accounts", "3"}, "needs --dev-state-dir"},
		{"output", []string{"--dev-state-dir", dir, "-o", "yaml"}, `invalid argument "yaml" for "-o, --output" flag: unknown output format (want table or json)`},
		{"key type", []string{"--dev-state-dir", dir, "--key-type", "dsa"}, "unknown key type"},
		{"sweep", []string{"--dev-state-dir", dir, "--sweep", "1,x"}, "positive integers"},
		{"sweep zero", []string{"--dev-state-dir", dir, "--sweep", "0"}, "positive integers"},
		{"chart format", []string{"--dev-state-dir", dir, "--chart", "c.gif"}, "want a .svg or .png"},
		{"arguments", []string{"extra"}, "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := benchRun(t, append([]string{"ca"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want %q", err, tt.want)
			}
			if tt.name == "output" && cli.ExitCode(err) != cli.ExitUsage {
				t.Errorf("exit status %d for a bad -o, want %d", cli.ExitCode(err), cli.ExitUsage)
			}
		})
	}
}

// startBenchCA runs the CA assembly (ca/caserver, as meshid dev runs it:
// a self-signed root, offline JWT authentication of a dev issuer) on a
// state directory laid out like meshid dev's: jwt-key.pem, jwks.json and
// root-cert.pem.
func startBenchCA(t *testing.T, rateLimit float64, rateBurst int) (addr, stateDir string) {
	t.Helper()
	stateDir = t.TempDir()
	if _, err := devissuer.LoadOrCreate(stateDir, ""); err != nil {
		t.Fatal(err)
	}
	s := testkit.CA(t, caserver.Config{
		StateDir: stateDir,
		Authn: caserver.AuthnConfig{
			JWKSFile: filepath.Join(stateDir, devissuer.JWKSFile),
		},
		Limits: caserver.LimitsConfig{
			Rate:  rateLimit,
			Burst: rateBurst,
		},
	})
	return s.Addr().String(), stateDir
}

// benchCAReport is the part of `bench ca -o json` the tests read.
type benchCAReport struct {
	Addr        string
	CryptoBound *struct {
		LeafKeyType    string  `json:"leaf_key_type"`
		CAKeyType      string  `json:"ca_key_type"`
		CertsPerSecond float64 `json:"certs_per_second"`
		BestRatio      float64 `json:"best_ratio"`
	} `json:"crypto_bound"`
	Runs []struct {
		Concurrency, Identities, Requests, OK int
		KeyType                               string `json:"key_type"`
		Pregen                                bool   `json:"pregen_keys"`
		Errors                                map[string]int
		Throughput                            float64 `json:"certs_per_second"`
		Latency                               struct {
			Count int
			P99   float64 `json:"p99_ms"`
		}
	}
}

func parseBenchCA(t *testing.T, stdout string) benchCAReport {
	t.Helper()
	var r benchCAReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	return r
}

func TestBenchCA(t *testing.T) {
	addr, dir := startBenchCA(t, 0, 0)
	tests := []struct {
		name     string
		args     []string
		wantRuns []int // concurrency of each run
		requests int
		ids      int
		keyType  string
	}{
		{"many service accounts, pregenerated", []string{"--service-accounts", "3", "--requests", "30", "--concurrency", "4", "--pregen-keys"}, []int{4}, 30, 3, "ec-p256"},
		{"fresh rsa key per request", []string{"--requests", "3", "--concurrency", "2", "--key-type", "rsa-2048"}, []int{2}, 3, 1, "rsa-2048"},
		{"sweep over two connections", []string{"--requests", "8", "--sweep", "1,4", "--connections", "2", "--pregen-keys"}, []int{1, 4}, 8, 1, "ec-p256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"ca", "--addr", addr, "--dev-state-dir", dir, "-o", "json", "-q"}, tt.args...)
			stdout, stderr, err := benchRun(t, args...)
			if err != nil {
				t.Fatalf("bench ca: %v\n%s", err, stderr)
			}
			r := parseBenchCA(t, stdout)
			if r.Addr != addr || len(r.Runs) != len(tt.wantRuns) || r.CryptoBound != nil {
				t.Fatalf("report:\n%s", stdout)
			}
			for i, run := range r.Runs {
				if run.Concurrency != tt.wantRuns[i] || run.Requests != tt.requests || run.OK != tt.requests ||
					len(run.Errors) != 0 || run.Identities != tt.ids || run.KeyType != tt.keyType ||
					run.Latency.Count != tt.requests || run.Latency.P99 <= 0 || run.Throughput <= 0 {
					t.Errorf("run %d:\n%s", i, stdout)
				}
			}
		})
	}
}

func TestBenchCAErrorsByCode(t *testing.T) {
	// A burst of 2 per caller and a refill of one token per 1000 s: each
	// service account gets exactly two certificates in this run.
	addr, dir := startBenchCA(t, 0.001, 2)
	stdout, stderr, err := benchRun(t, "ca", "--addr", addr, "--dev-state-dir", dir, "--service-accounts", "3",
		"--requests", "30", "--concurrency", "3", "--pregen-keys", "-o", "json")
	if err != nil {
		t.Fatalf("bench ca: %v\n%s", err, stderr)
	}
	run := parseBenchCA(t, stdout).Runs[0]
	if run.Requests != 30 || run.OK != 6 || run.Errors["ResourceExhausted"] != 24 || len(run.Errors) != 1 {
		t.Errorf("report:\n%s", stdout)
	}
	if !strings.Contains(stderr, "bench ca: 127.0.0.1:") || !strings.Contains(stderr, "generating 3 ec-p256 key(s)") {
		t.Errorf("progress header missing from stderr:\n%s", stderr)
	}

	// Tokens for another audience are refused: every request fails, in
	// the table and in the exit status.
	stdout, _, err = benchRun(t, "ca", "--addr", addr, "--dev-state-dir", dir, "--audience", "other",
		"--requests", "5", "--pregen-keys", "-q")
	if err == nil || !strings.Contains(err.Error(), "no request succeeded at concurrency 8 (Unauthenticated=5)") {
		t.Errorf("err = %v", err)
	}
	if !strings.Contains(stdout, "CONCURRENCY") || !strings.Contains(stdout, "Unauthenticated=5") {
		t.Errorf("table:\n%s", stdout)
	}

	// A wrong server name fails the TLS handshake: Unavailable.
	_, _, err = benchRun(t, "ca", "--addr", addr, "--dev-state-dir", dir, "--server-name", "evil.example",
		"--requests", "2", "--pregen-keys", "-q", "--timeout", "5s")
	if err == nil || !strings.Contains(err.Error(), "Unavailable=2") {
		t.Errorf("wrong server name: err = %v", err)
	}
}

func TestBenchCAChartAndBound(t *testing.T) {
	addr, dir := startBenchCA(t, 0, 0)
	svg := filepath.Join(t.TempDir(), "ca.svg")
	stdout, stderr, err := benchRun(t, "ca", "--addr", addr, "--dev-state-dir", dir, "--requests", "4",
		"--sweep", "1,2", "--pregen-keys", "--crypto-bound", "--crypto-bound-duration", "10ms", "--chart", svg)
	if err != nil {
		t.Fatalf("bench ca: %v\n%s", err, stderr)
	}
	for _, want := range []string{"CONCURRENCY", "\n1 ", "\n2 ", "in-process crypto bound:", "ec-p256 CSR check + ec-p256 CA signature"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("in-process crypto bound")) {
		t.Errorf("chart: %v", err)
	}
	if !strings.Contains(stderr, "wrote "+svg) {
		t.Errorf("stderr:\n%s", stderr)
	}

	prof := filepath.Join(t.TempDir(), "load.prof")
	stdout, _, err = benchRun(t, "ca", "--addr", addr, "--dev-state-dir", dir, "--requests", "2", "--pregen-keys",
		"--crypto-bound", "--crypto-bound-duration", "10ms", "--key-type", "rsa-2048", "-o", "json", "-q", "--cpuprofile", prof)
	if err != nil {
		t.Fatal(err)
	}
	// --cpuprofile: a gzipped profile (go tool pprof reads it).
	if b, err := os.ReadFile(prof); err != nil || !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Errorf("--cpuprofile: %v, %d bytes", err, len(b))
	}
	_, _, err = benchRun(t, "ca", "--addr", addr, "--dev-state-dir", dir, "--requests", "1", "-q",
		"--cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir", "load.prof"))
	if err == nil || !strings.Contains(err.Error(), "--cpuprofile") {
		t.Errorf("--cpuprofile in a missing directory: %v", err)
	}
	r := parseBenchCA(t, stdout)
	if b := r.CryptoBound; b == nil || b.LeafKeyType != "rsa-2048" || b.CAKeyType != "ec-p256" || b.CertsPerSecond <= 0 || b.BestRatio <= 0 {
		t.Errorf("crypto bound:\n%s", stdout)
	}
}

// benchAgent is the agent assembly (sds/agent, what meshid agent runs)
// signed by a real Authority in process, with its real monitoring listener
// and so its real POST /debug/rotate.
type benchAgent struct {
	socket string
	admin  string
	reg    *prometheus.Registry
}

func startBenchAgent(t *testing.T) *benchAgent {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	a := &benchAgent{reg: prometheus.NewRegistry()}
	ag := testkit.RunAgent(t, agent.Config{
		Signer:           testkit.AuthoritySigner{Authority: testkit.NewAuthority(t, td, nil, nil), Caller: "bench test"},
		Namespace:        "bench",
		ServiceAccount:   "bench-0",
		CertTTL:          time.Hour,
		MonitoringListen: "127.0.0.1:0",
		DebugEndpoints:   true,
		Registerer:       a.reg,
	})
	a.socket, a.admin = ag.SocketPath(), ag.MonitoringAddr().String()
	return a
}

// rotations is how many certificates the agent has obtained (the first
// included).
func (a *benchAgent) rotations(t *testing.T) float64 {
	return testkit.Metric(t, a.reg, "meshid_agent_rotations_total")
}

func TestBenchSDS(t *testing.T) {
	a := startBenchAgent(t)

	stdout, stderr, err := benchRun(t, "sds", "--sds-socket", a.socket, "--streams", "40",
		"--streams-per-conn", "15", "--rotate", "--agent-admin", a.admin, "-o", "json", "-q", "--slowest", "3")
	if err != nil {
		t.Fatalf("bench sds: %v\n%s", err, stderr)
	}
	if stderr != "" {
		t.Errorf("-q printed progress: %q", stderr)
	}
	var rep struct {
		Streams, Connections, Ready, Failed int
		Resources                           []string
		TimeToReady                         struct{ Count int } `json:"time_to_ready"`
		GCCycles                            *uint64             `json:"gc_cycles"`
		Slowest                             []struct {
			Stream  int
			TotalMS float64 `json:"total_ms"`
		}
		Memory   *struct{}
		Rotation *struct {
			Streams, Rotated int
			AllMS            float64 `json:"all_ms"`
		}
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if rep.Streams != 40 || rep.Connections != 3 || rep.Ready != 40 || rep.Failed != 0 || rep.TimeToReady.Count != 40 ||
		strings.Join(rep.Resources, ",") != "default,ROOTCA" {
		t.Errorf("report:\n%s", stdout)
	}
	if rep.Memory != nil {
		t.Errorf("memory reported without --agent-pid:\n%s", stdout)
	}
	if len(rep.Slowest) != 3 || rep.Slowest[0].TotalMS <= 0 || rep.Slowest[0].TotalMS < rep.Slowest[2].TotalMS {
		t.Errorf("--slowest 3 listed %+v:\n%s", rep.Slowest, stdout)
	}
	if rep.GCCycles == nil || *rep.GCCycles != 0 {
		t.Errorf("the tool's collector ran while it measured (--hold-gc is on by default):\n%s", stdout)
	}
	if n := a.rotations(t); n != 2 || rep.Rotation == nil || rep.Rotation.Streams != 40 || rep.Rotation.Rotated != 40 || rep.Rotation.AllMS <= 0 {
		t.Errorf("certificates obtained = %v, want the first and one rotation; report:\n%s", n, stdout)
	}

	// The table, with the memory of a process given as the agent.
	stdout, _, err = benchRun(t, "sds", "--sds-socket", a.socket, "--streams", "5", "--agent-pid", "1", "-q")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"5/5 (0 failed)", "TIME TO READY", "AGENT RSS", "with streams open"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
}

// TestBenchSDSHoldGC: by default the tool's collector stays off while it
// measures; --hold-gc=false leaves it on, and the report counts its
// collections (GOGC=1 here, so that a run with the collector on collects).
func TestBenchSDSHoldGC(t *testing.T) {
	a := startBenchAgent(t)
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	for _, tc := range []struct {
		flag    string
		collect bool
	}{{"--hold-gc=true", false}, {"--hold-gc=false", true}} {
		stdout, stderr, err := benchRun(t, "sds", "--sds-socket", a.socket, "--streams", "100", "--open-concurrency", "1", tc.flag, "-o", "json", "-q")
		if err != nil {
			t.Fatalf("bench sds %s: %v\n%s", tc.flag, err, stderr)
		}
		var rep struct {
			GCCycles uint64 `json:"gc_cycles"`
		}
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil || (rep.GCCycles > 0) != tc.collect {
			t.Errorf("%s: gc_cycles = %d (%v), want collections: %v\n%s", tc.flag, rep.GCCycles, err, tc.collect, stdout)
		}
	}
}

func TestBenchSDSErrors(t *testing.T) {
	a := startBenchAgent(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"output", []string{"--sds-socket", a.socket, "-o", "yaml"}, `invalid argument "yaml" for "-o, --output" flag: unknown output format (want table or json)`},
		{"streams", []string{"--sds-socket", a.socket, "--streams", "0"}, "must be positive"},
		{"admin refuses", []string{"--sds-socket", a.socket, "--streams", "2", "--rotate", "--agent-admin", a.admin + "/nope"}, "forcing a rotation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := benchRun(t, append([]string{"sds", "-q"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want %q", err, tt.want)
			}
			if tt.name == "output" && cli.ExitCode(err) != cli.ExitUsage {
				t.Errorf("exit status %d for a bad -o, want %d", cli.ExitCode(err), cli.ExitUsage)
			}
		})
	}
}
