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

// svidPath is one way a workload pod gets its first SVID, as
// BenchmarkPodsToFirstSVID measures it.
type svidPath struct {
	name string
	// pod is workload pod name of service account sa in ns.
	pod func(b *testing.B, ns, name, sa string) *corev1.Pod
	// container prints, once it holds the SVID, a line that atRE matches
	// with the time (UNIXNANO, the node's clock) as its first group.
	container string
	atRE      *regexp.Regexp
	// agents: each pod runs a meshid agent, whose memory is reported.
	agents bool
}

var svidPaths = []svidPath{{
	// The agent sidecar of deploy/examples/agent-sidecar.yaml; the
	// workload, in Envoy's place, fetches the SVID over the agent's SDS
	// socket once the agent's startup probe (period 1 s) lets it start.
	name: "sds",
	pod: func(b *testing.B, ns, name, sa string) *corev1.Pod {
		return sidecarPod(b, ns, name, sa, map[string]string{"app": "bench"}, "serve", ":8443")
	},
	container: "workload",
	atRE:      regexp.MustCompile(`sds spiffe://\S+ roots=\d+ at=(\d+)`),
	agents:    true,
}, {
	// No agent: a podCertificate volume of the chart's signer, which the
	// kubelet fills (key, PodCertificateRequest, meshid's signature)
	// before it starts the container; the probe reads the credential
	// bundle as it starts. Its container gets the requests of the
	// example's Envoy, as the SDS path's workload does.
	name: "podcert",
	pod: func(b *testing.B, ns, name, sa string) *corev1.Pod {
		p := podCertPod(ns, name, sa)
		p.Spec.Containers[0].Resources = exampleProxy(b).Resources
		return p
	},
	container: "app",
	atRE:      regexp.MustCompile(`cert serial=[0-9a-f]+ uri=spiffe://\S+ at=(\d+)`),
}}

// BenchmarkPodsToFirstSVID measures, for each svidPath (run with
// -benchtime=1x: one iteration each), the time from a workload pod's
// create call to its SVID in the workload container:
//
//   - one-at-a-time: 10 pods created one after the other, each once the
//     one before holds its SVID, on an otherwise idle node (p50, max):
//     what a user compares with Istio or SPIRE;
//   - 100-at-once: 100 pods created at once (p50, p99, max), and then,
//     with the 100 running, the resident memory of their agents (median,
//     max; the SDS path only) and of the two CA replicas (the larger,
//     before and after the 100), from /proc on the node.
//
// Each path's pods are deleted before the next path starts.
func BenchmarkPodsToFirstSVID(b *testing.B) {
	need(b)
	installMeshid(b)
	for _, p := range svidPaths {
		b.Run(p.name+"/one-at-a-time", func(b *testing.B) { p.oneAtATime(b, 10) })
		b.Run(p.name+"/100-at-once", func(b *testing.B) { p.atOnce(b, 100) })
	}
}

// oneAtATime creates n pods, each once the one before has its SVID.
func (p svidPath) oneAtATime(b *testing.B, n int) {
	for range b.N {
		ns := p.namespace(b)
		lat := make([]time.Duration, n)
		load := loadAvg()
		b.ResetTimer() // (which drops the metrics reported so far)
		b.ReportMetric(load, "loadavg-1m")
		for j := range lat {
			pod := p.pod(b, ns, fmt.Sprintf("s%02d", j), "bench")
			lat[j] = p.await(b, ns, []*corev1.Pod{pod}, 200*time.Millisecond)[0]
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(lat[n/2].Seconds(), "p50-s")
		b.ReportMetric(lat[n-1].Seconds(), "max-s")
		p.cleanup(b, ns)
	}
}

// atOnce creates n pods at once.
func (p svidPath) atOnce(b *testing.B, n int) {
	for range b.N {
		ns := p.namespace(b)
		pods := make([]*corev1.Pod, n)
		for j := range pods {
			pods[j] = p.pod(b, ns, fmt.Sprintf("w%03d", j), "bench")
			// n pods at the example's requests (10m + 50m CPU for the
			// SDS path) would not fit the node's 2 CPUs: 5m each.
			spec := &pods[j].Spec
			for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
				for k := range cs {
					cs[k].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("5m")
				}
			}
		}
		caBefore := rssOf("/meshid\x00server")
		load := loadAvg()
		b.ResetTimer()
		b.ReportMetric(load, "loadavg-1m")
		lat := p.await(b, ns, pods, time.Second)
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(lat[n/2].Seconds(), "p50-s")
		b.ReportMetric(lat[n*99/100-1].Seconds(), "p99-s")
		b.ReportMetric(lat[n-1].Seconds(), "max-s")
		if p.agents {
			agents := rssOf("/meshid-agent\x00")
			if len(agents) < n {
				b.Fatalf("found %d agents for %d pods", len(agents), n)
			}
			b.ReportMetric(mib(agents[len(agents)/2]), "agent-rss-p50-MiB")
			b.ReportMetric(mib(agents[len(agents)-1]), "agent-rss-max-MiB")
		}
		cas := rssOf("/meshid\x00server")
		if len(caBefore) != 2 || len(cas) != 2 {
			b.Fatalf("found %d, then %d CA processes, want 2", len(caBefore), len(cas))
		}
		b.ReportMetric(mib(caBefore[1]), "ca-rss-before-MiB")
		b.ReportMetric(mib(cas[1]), "ca-rss-max-MiB")
		p.cleanup(b, ns)
	}
}

var benchNamespaces int

// namespace makes a new namespace with the service account "bench" and
// waits for the CA's root ConfigMap in it.
func (p svidPath) namespace(b *testing.B) string {
	benchNamespaces++
	ns := fmt.Sprintf("bench-%s-%d", p.name, benchNamespaces)
	ctx := context.Background()
	if err := cluster.EnsureNamespace(ctx, ns); err != nil {
		b.Fatal(err)
	}
	c := cluster.Client()
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// The SDS pods mount the root ConfigMap: the first pod is not to wait
	// for its publication into the new namespace.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		b.Fatalf("no istio-ca-root-cert in %s: %v", ns, err)
	}
	return ns
}

// await creates pods, one after the other with no pause, and returns the
// time from each one's create call to the SVID in it, reading the pods'
// logs every poll until each has its line.
func (p svidPath) await(b *testing.B, ns string, pods []*corev1.Pod, poll time.Duration) []time.Duration {
	ctx := context.Background()
	c := cluster.Client()
	created := make([]time.Time, len(pods))
	for j, pod := range pods {
		created[j] = time.Now()
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, len(pods))
	err := wait.PollUntilContextTimeout(ctx, poll, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		done := true
		for j, pod := range pods {
			if lat[j] != 0 {
				continue
			}
			raw, err := c.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: p.container}).DoRaw(ctx)
			m := p.atRE.FindSubmatch(raw)
			if err != nil || m == nil {
				done = false
				continue
			}
			at, _ := strconv.ParseInt(string(m[1]), 10, 64)
			lat[j] = time.Unix(0, at).Sub(created[j])
		}
		return done, nil
	})
	if err != nil {
		list, _ := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		var stuck []corev1.Pod
		if list != nil {
			stuck = slices.DeleteFunc(list.Items, func(q corev1.Pod) bool { return q.Status.Phase == corev1.PodRunning })
		}
		b.Fatalf("not every pod got its SVID: %v\n%s\n%s", err, describe(stuck), nd.Logs())
	}
	return lat
}

// cleanup deletes the pods of ns and waits until they are gone (a grace
// period, so that the API server keeps each until the kubelet has stopped
// its containers), so that what runs next has the node to itself.
func (p svidPath) cleanup(b *testing.B, ns string) {
	grace := int64(1)
	if err := cluster.Client().CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		b.Fatalf("the pods of %s are not gone: %v", ns, err)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// loadAvg is the machine's load average over the last minute, reported
// beside the times: the node shares its cores with whatever else runs.
func loadAvg() float64 {
	raw, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); len(f) > 0 {
		if load, err := strconv.ParseFloat(f[0], 64); err == nil {
			return load
		}
	}
	return 0
}

// rssOf is the resident memory, in bytes and ascending, of every process
// whose command line starts with prefix (NUL-separated arguments).
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
	slices.Sort(out)
	return out
}
