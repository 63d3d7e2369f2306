package podcert_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/test/kube/harness"
)

// BenchmarkPodCertificates: a node's reboot (200 pods on one node) and a
// cluster restart (2,000 pods on 10 nodes), every request issued, in two
// ways. drain: the requests are all pending when the signer starts leading
// (a CA restart during the storm); rate = requests / (last Issued status
// − first Issued status seen). storm: the kubelets create them while the
// signer leads; rate = requests / (first created → last Issued), which
// the API server's rate of creating them bounds (creates/s). And what the
// signer cost the API server per request, from its own /metrics: status
// writes (PUT …/status) and GETs of pods, service accounts and nodes (the
// informers should answer). Run with -benchtime=1x:
//
//	cd test/kube && GOFLAGS=-mod=mod go test -run '^$' -bench PodCertificates -benchtime=1x ./podcert/
func BenchmarkPodCertificates(b *testing.B) {
	for _, sc := range []struct{ pods, nodes int }{{200, 1}, {2000, 10}} {
		b.Run(fmt.Sprintf("pods=%d/nodes=%d", sc.pods, sc.nodes), func(b *testing.B) {
			benchStorm(b, sc.pods, sc.nodes)
		})
	}
}

// storm is the pods of a benchmark and their kubelets' requests.
type storm struct {
	ns    string
	reqs  []*certificatesv1.PodCertificateRequest
	owner []*kubelet
}

func newStorm(b *testing.B, ctx context.Context, pods, nodes int) *storm {
	s := &storm{ns: fmt.Sprintf("pc-bench-%d", pods), reqs: make([]*certificatesv1.PodCertificateRequest, pods), owner: make([]*kubelet, pods)}
	sa := workload(b, ctx, s.ns, "app")
	kubelets := make([]*kubelet, nodes)
	for i := range nodes {
		kubelets[i] = newKubelet(b, ctx, fmt.Sprintf("node-bench-%d-%d", pods, i))
	}
	for i := range pods {
		k := kubelets[i%nodes]
		pod := createPod(b, ctx, s.ns, fmt.Sprintf("app-%d", i), sa.Name, k.node.Name, signerName)
		s.reqs[i], s.owner[i] = request(b, pod, k.node, sa, signerName, newKey(b, "ECDSAP256")), k
	}
	return s
}

// create makes every request at once, as the kubelets would, and returns
// how long the API server took to take them.
func (s *storm) create(b *testing.B, ctx context.Context) time.Duration {
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(64)
	for i, r := range s.reqs {
		g.Go(func() error {
			_, err := s.owner[i].client.CertificatesV1().PodCertificateRequests(s.ns).Create(ctx, r, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

func (s *storm) clear(b *testing.B, ctx context.Context) {
	if err := cluster.Client().CertificatesV1().PodCertificateRequests(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
}

func benchStorm(b *testing.B, pods, nodes int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s := newStorm(b, ctx, pods, nodes)

	// drain: pending before the signer leads.
	w := watchIssued(b, ctx, s.ns, pods)
	s.create(b, ctx)
	before := apiMetrics(b, ctx)
	cpu0, err := cluster.APIServerCPU()
	if err != nil {
		b.Fatal(err)
	}
	startCA(b, caserver.Config{})
	first, last := w.wait(b, ctx)
	cpu1, err := cluster.APIServerCPU()
	if err != nil {
		b.Fatal(err)
	}
	cost := apiCost(b, ctx, before, pods)
	drain := float64(pods) / last.Sub(first).Seconds()
	// The API server's CPU per request answered, over the drain (its
	// start included): what bounds the rate on a shared 2-core machine.
	apiCPU := float64((cpu1 - cpu0).Microseconds()) / 1000 / float64(pods)
	s.clear(b, ctx)

	for b.Loop() {
		w := watchIssued(b, ctx, s.ns, pods)
		before := apiMetrics(b, ctx)
		start := time.Now()
		created := s.create(b, ctx)
		_, last := w.wait(b, ctx)
		b.ReportMetric(float64(pods)/last.Sub(start).Seconds(), "storm-pcrs/s")
		b.ReportMetric(float64(pods)/created.Seconds(), "creates/s")
		cost = append(cost, apiCost(b, ctx, before, pods)...)
		b.StopTimer()
		s.clear(b, ctx)
		b.StartTimer()
	}
	b.ReportMetric(drain, "drain-pcrs/s") // after the loop, which resets the metrics
	b.ReportMetric(apiCPU, "apiserver-cpu-ms/pcr")
	// The worst of the runs.
	writes, gets := 0.0, 0.0
	for i := 0; i < len(cost); i += 2 {
		writes, gets = max(writes, cost[i]), max(gets, cost[i+1])
	}
	b.ReportMetric(writes, "writes/pcr")
	b.ReportMetric(gets, "gets/pcr")
}

// apiCost returns the status writes and the object GETs per request since
// before.
func apiCost(b *testing.B, ctx context.Context, before harness.APIMetrics, pods int) []float64 {
	after := apiMetrics(b, ctx)
	delta := func(labels ...string) float64 {
		x, err := after.Sum("apiserver_request_total", labels...)
		if err != nil {
			b.Fatal(err)
		}
		y, err := before.Sum("apiserver_request_total", labels...)
		if err != nil {
			b.Fatal(err)
		}
		return x - y
	}
	writes := delta(`resource="podcertificaterequests"`, `subresource="status"`, `verb="PUT"`)
	gets := 0.0
	for _, res := range []string{"pods", "serviceaccounts", "nodes"} {
		gets += delta(`resource="`+res+`"`, `verb="GET"`)
	}
	return []float64{writes / float64(pods), gets / float64(pods)}
}

func apiMetrics(b *testing.B, ctx context.Context) harness.APIMetrics {
	m, err := cluster.APIServerMetrics(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// issuedWatch follows a namespace's requests until n are Issued.
type issuedWatch struct {
	done        chan error
	mu          sync.Mutex
	issued      map[string]bool
	first, last time.Time
}

// wait returns when the first and the last request was seen Issued.
func (w *issuedWatch) wait(b *testing.B, ctx context.Context) (time.Time, time.Time) {
	select {
	case err := <-w.done:
		if err != nil {
			b.Fatal(err)
		}
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first, w.last
}

// watchIssued follows ns until n requests are Issued, failing on any other
// answer. An informer, not a bare watch: the API server closes a watch
// that falls behind a storm, and the informer lists again.
func watchIssued(b *testing.B, ctx context.Context, ns string, n int) *issuedWatch {
	ctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	factory := informers.NewSharedInformerFactoryWithOptions(cluster.Client(), 0, informers.WithNamespace(ns))
	inf := factory.Certificates().V1().PodCertificateRequests().Informer()
	w := &issuedWatch{done: make(chan error, 1), issued: map[string]bool{}}
	report := func(err error) {
		select {
		case w.done <- err:
		default:
		}
	}
	see := func(obj any) {
		r, ok := obj.(*certificatesv1.PodCertificateRequest)
		if !ok || len(r.Status.Conditions) == 0 {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if typ, reason, msg := condition(r); typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
			report(fmt.Errorf("%s: %s %s %s", r.Name, typ, reason, msg))
			return
		}
		if w.issued[r.Name] {
			return
		}
		w.issued[r.Name] = true
		if len(w.issued) == 1 {
			w.first = now
		}
		w.last = now
		if len(w.issued) == n {
			report(nil)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }}); err != nil {
		b.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("informer did not sync")
	}
	return w
}
