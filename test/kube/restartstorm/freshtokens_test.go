package restartstorm_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/harness"
)

// freshTokens is the storm of BenchmarkFreshTokens: pods and tokens, one
// CSR each. 5,000: at 1,000 the local run lasted 0.3-0.4 s, short enough
// for the connection's start and one GC more or less to move the figure.
var freshTokens = flag.Int("fresh-tokens", 5000, "pods, tokens and CSRs of BenchmarkFreshTokens")

// kubeQPS is the CA's --kube-qps (and twice that its --kube-burst) in
// BenchmarkFreshTokens. The CA's default client-side limit (500/s, burst
// 1,000) would cap the tokenreview mode at 625 certs/s for 5,000 tokens:
// that would measure meshid's own limiter, not the API server's reviews.
// Lifted by default, so that the comparison is against the API server;
// -kube-qps 0 keeps the CA's defaults.
var kubeQPS = flag.Int("kube-qps", 100000, "the CA's --kube-qps in BenchmarkFreshTokens (0: its default)")

// BenchmarkFreshTokens is issue 15's comparison, with the tools a user
// runs: the real `meshid server` binary as deploy/'s meshid ServiceAccount
// (with deploy/15-local-verification.yaml applied), once per
// --token-verification mode, loaded by `meshid-bench ca --fresh-tokens
// 5000` (5,000 pods with spec.nodeName, one pod-bound token each, one CSR
// per token, 16 in flight), which reports certs/s, latency and the API
// server's requests by resource. The cluster signs tokens with RSA-2048
// (RS256) unless -sa-key-type ec-p256 says ES256. Figures:
// docs/benchmarks.md.
//
//	cd test/kube && GOFLAGS=-mod=mod go test -run XXX -bench FreshTokens -benchtime 1x ./restartstorm
//	cd test/kube && GOFLAGS=-mod=mod go test -run XXX -bench FreshTokens -benchtime 1x ./restartstorm -args -sa-key-type ec-p256
func BenchmarkFreshTokens(b *testing.B) {
	bin := b.TempDir()
	meshid, err := harness.BuildMeshid(bin)
	if err != nil {
		b.Fatal(err)
	}
	bench := buildBench(b, bin)
	applyLocalVerificationRBAC(b)
	for _, mode := range []string{"tokenreview", "local"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				out := freshRun(b, meshid, bench, mode)
				b.ReportMetric(out.Runs[0].Throughput, "certs/s")
				b.ReportMetric(out.APIServerRequests["tokenreviews"], "tokenreviews")
				b.ReportMetric(out.Runs[0].CACPU, "CA-CPU-µs/cert")
				r := out.Runs[0]
				b.Logf("%s, %s service-account key: %.1f certs/s, latency %v, CA CPU %.0fµs/cert, load CPU %.0fµs/cert, API server requests %v",
					mode, *saKeyType, r.Throughput, r.Latency, r.CACPU, r.LoadCPU, out.APIServerRequests)
			}
		})
	}
}

type benchOutput struct {
	Runs []struct {
		Requests   int            `json:"requests"`
		OK         int            `json:"ok"`
		Errors     map[string]int `json:"errors"`
		Throughput float64        `json:"certs_per_second"`
		Latency    map[string]any `json:"latency"`
		CACPU      float64        `json:"ca_cpu_us_per_cert"`
		LoadCPU    float64        `json:"client_cpu_us_per_cert"`
	} `json:"runs"`
	APIServerRequests map[string]float64 `json:"apiserver_requests"`
}

func buildBench(b *testing.B, dir string) string {
	repo, err := harness.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "meshid-bench")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/meshid-bench")
	cmd.Dir = repo
	if o, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/meshid-bench: %v\n%s", err, o)
	}
	return out
}

// applyLocalVerificationRBAC applies deploy/15-local-verification.yaml for the
// benchmark and removes it afterwards.
func applyLocalVerificationRBAC(b *testing.B) {
	repo, err := harness.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", "15-local-verification.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cluster.Apply(ctx, objs...); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		rb := cluster.Client().RbacV1()
		_ = rb.ClusterRoleBindings().Delete(ctx, "meshid-local-verification", metav1.DeleteOptions{})
		_ = rb.ClusterRoles().Delete(ctx, "meshid-local-verification", metav1.DeleteOptions{})
	})
}

// freshRun starts a fresh CA in mode and runs meshid-bench against it.
func freshRun(b *testing.B, meshid, bench, mode string) benchOutput {
	dir := b.TempDir()
	addr, err := harness.FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	monitor, err := harness.FreeAddr()
	if err != nil {
		b.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	args := []string{"server",
		"--listen", addr, "--monitoring-listen", monitor, "--state-dir", state,
		"--kubeconfig", caKubeconfig, "--token-verification", mode, "--publish-root-configmap=false"}
	if *kubeQPS > 0 {
		args = append(args, "--kube-qps", fmt.Sprint(*kubeQPS), "--kube-burst", fmt.Sprint(2**kubeQPS))
	}
	ca, err := harness.StartProcess("meshid-server", meshid, filepath.Join(dir, "server.log"), nil, args...)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := ca.Stop(20 * time.Second); err != nil {
			b.Error(err)
		}
		if b.Failed() {
			b.Logf("meshid server log:\n%s", ca.Tail(8192))
		}
	}()
	want := `meshid_ca_token_verification_mode{mode="` + mode + `"} 1`
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		resp, err := http.Get("http://" + monitor + "/metrics")
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), want), nil
	})
	if err != nil {
		b.Fatalf("the CA never reported %s: %v", want, err)
	}
	cmd := exec.Command(bench, "ca", "--addr", addr, "--ca-root", filepath.Join(state, "root-cert.pem"),
		"--kubeconfig", cluster.AdminKubeconfig(), "--fresh-tokens", fmt.Sprint(*freshTokens),
		"--namespace", "fresh-"+mode, "--pregen-keys", "--concurrency", "16", "--ca-pid", fmt.Sprint(ca.PID()), "-o", "json", "-q")
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		b.Fatalf("meshid-bench: %v\n%s", err, raw)
	}
	var out benchOutput
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Runs) != 1 {
		b.Fatalf("meshid-bench output %s: %v", raw, err)
	}
	if r := out.Runs[0]; r.OK != *freshTokens {
		b.Fatalf("%d of %d CSRs signed: %v", r.OK, r.Requests, r.Errors)
	}
	return out
}
