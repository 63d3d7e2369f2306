package podcert_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/test/kube/harness"
)

// BenchmarkPodCertificates: a node's reboot (200 pods on one node, each
// asking for its certificate at once) and a cluster restart (2,000 pods on
// 10 nodes): every request issued, reported as requests per second (first
// request created to last Issued status seen), and what the signer cost
// the API server per request, read from its own /metrics: status writes,
// and GETs of pods, service accounts and nodes (the informers should
// answer). Run with -benchtime=1x:
//
//	cd test/kube && GOFLAGS=-mod=mod go test -run '^$' -bench PodCertificates -benchtime=1x ./podcert/
func BenchmarkPodCertificates(b *testing.B) {
	for _, sc := range []struct{ pods, nodes int }{{200, 1}, {2000, 10}} {
		b.Run(fmt.Sprintf("pods=%d/nodes=%d", sc.pods, sc.nodes), func(b *testing.B) {
			benchStorm(b, sc.pods, sc.nodes)
		})
	}
}

func benchStorm(b *testing.B, pods, nodes int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("pc-bench-%d", pods)
	sa := workload(b, ctx, ns, "app")
	startCA(b, caserver.Config{})
	kubelets := make([]*kubelet, nodes)
	for i := range nodes {
		kubelets[i] = newKubelet(b, ctx, fmt.Sprintf("node-bench-%d-%d", pods, i))
	}
	reqs := make([]*certificatesv1.PodCertificateRequest, pods)
	owner := make([]*kubelet, pods)
	for i := range pods {
		k := kubelets[i%nodes]
		pod := createPod(b, ctx, ns, fmt.Sprintf("app-%d", i), sa.Name, k.node.Name, signerName)
		reqs[i], owner[i] = request(b, pod, k.node, sa, signerName, newKey(b, "ECDSAP256")), k
	}
	for b.Loop() {
		list, err := cluster.Client().CertificatesV1().PodCertificateRequests(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			b.Fatal(err)
		}
		w, err := cluster.Client().CertificatesV1().PodCertificateRequests(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			b.Fatal(err)
		}
		before := apiMetrics(b, ctx)
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(64)
		for i, r := range reqs {
			g.Go(func() error {
				_, err := owner[i].client.CertificatesV1().PodCertificateRequests(ns).Create(ctx, r, metav1.CreateOptions{})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		issued := map[string]bool{}
		for len(issued) < pods {
			ev, ok := <-w.ResultChan()
			if !ok {
				b.Fatalf("watch ended with %d of %d issued", len(issued), pods)
			}
			r, isPCR := ev.Object.(*certificatesv1.PodCertificateRequest)
			if !isPCR || ev.Type != watch.Modified || len(r.Status.Conditions) == 0 {
				continue
			}
			if typ, reason, msg := condition(r); typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
				b.Fatalf("%s: %s %s %s", r.Name, typ, reason, msg)
			}
			issued[r.Name] = true
		}
		elapsed := time.Since(start)
		w.Stop()
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
		writes := delta(`resource="podcertificaterequests"`, `subresource="status"`, `verb="UPDATE"`)
		gets := 0.0
		for _, res := range []string{"pods", "serviceaccounts", "nodes"} {
			gets += delta(`resource="`+res+`"`, `verb="GET"`)
		}
		b.ReportMetric(float64(pods)/elapsed.Seconds(), "pcrs/s")
		b.ReportMetric(writes/float64(pods), "writes/pcr")
		b.ReportMetric(gets/float64(pods), "gets/pcr")
		b.StopTimer()
		if err := cluster.Client().CertificatesV1().PodCertificateRequests(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func apiMetrics(b *testing.B, ctx context.Context) harness.APIMetrics {
	m, err := cluster.APIServerMetrics(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return m
}
