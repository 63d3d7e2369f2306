package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

var svidAtRE = regexp.MustCompile(`sds spiffe://\S+ roots=\d+ at=(\d+)`)

// BenchmarkPodsToFirstSVID creates 100 workload pods with the agent
// sidecar at once (one iteration; run with -benchtime=1x) and reports the
// time from each pod's creation to the SVID arriving in its workload
// container over SDS (p50, p99, max; the agent's startup probe, period
// 1 s, gates the workload container, as in the example), and the resident
// memory of the agents (median, max) and of the CA replicas (max), read
// from /proc on the node with 100 workloads running.
func BenchmarkPodsToFirstSVID(b *testing.B) {
	need(b)
	installMeshid(b)
	const pods = 100
	ctx := context.Background()
	c := cluster.Client()
	for i := range b.N {
		ns := fmt.Sprintf("bench%d", i)
		if err := cluster.EnsureNamespace(ctx, ns); err != nil {
			b.Fatal(err)
		}
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		specs := make([]*corev1.Pod, pods)
		for j := range specs {
			specs[j] = sidecarPod(b, ns, fmt.Sprintf("w%03d", j), "bench", map[string]string{"app": "bench"}, "serve", ":8443")
			// 100 pods at the example's requests (10m + 50m CPU) need 6
			// CPUs; the node has 2: 5m each, so that all fit.
			for _, c := range []*corev1.Container{&specs[j].Spec.InitContainers[0], &specs[j].Spec.Containers[0]} {
				c.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("5m")
			}
		}
		created := make([]time.Time, pods)
		b.ResetTimer()
		for j, p := range specs {
			created[j] = time.Now()
			if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		lat := make([]time.Duration, pods)
		err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
			done := true
			for j := range specs {
				if lat[j] != 0 {
					continue
				}
				raw, err := c.CoreV1().Pods(ns).GetLogs(specs[j].Name, &corev1.PodLogOptions{Container: "workload"}).DoRaw(ctx)
				m := svidAtRE.FindSubmatch(raw)
				if err != nil || m == nil {
					done = false
					continue
				}
				at, _ := strconv.ParseInt(string(m[1]), 10, 64)
				lat[j] = time.Unix(0, at).Sub(created[j])
			}
			return done, nil
		})
		b.StopTimer()
		if err != nil {
			b.Fatalf("not every pod got its SVID: %v\n%s", err, nd.Logs())
		}
		slices.Sort(lat)
		b.ReportMetric(lat[pods/2].Seconds(), "p50-s")
		b.ReportMetric(lat[pods*99/100-1].Seconds(), "p99-s")
		b.ReportMetric(lat[pods-1].Seconds(), "max-s")
		agents := rssOf("/meshid-agent\x00")
		cas := rssOf("/meshid\x00server")
		slices.Sort(agents)
		slices.Sort(cas)
		if len(agents) < pods || len(cas) != 2 {
			b.Fatalf("found %d agents and %d CA processes", len(agents), len(cas))
		}
		b.ReportMetric(float64(agents[len(agents)/2])/(1<<20), "agent-rss-p50-MiB")
		b.ReportMetric(float64(agents[len(agents)-1])/(1<<20), "agent-rss-max-MiB")
		b.ReportMetric(float64(cas[len(cas)-1])/(1<<20), "ca-rss-max-MiB")
	}
}

// rssOf is the resident memory, in bytes, of every process whose command
// line starts with prefix (NUL-separated arguments).
func rssOf(prefix string) []int64 {
	var out []int64
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if !strings.HasPrefix(string(cmd), prefix) {
			continue
		}
		status, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				out = append(out, kb<<10)
			}
		}
	}
	return out
}
