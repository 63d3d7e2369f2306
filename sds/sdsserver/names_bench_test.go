package sdsserver_test

import (
	"context"
	"fmt"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

// BenchmarkHugeRequest sends one request naming n resources over the real
// socket to a server with a real Manager, and waits for its answer: above
// DefaultMaxResourceNames the refusal (ResourceExhausted), at it the
// default certificate. cpu-ms/op is the CPU of client and server together
// (the client marshals the request), an upper bound of the agent's: the
// target is < 50 ms for 40,000 names (issue 9, hole 8).
func BenchmarkHugeRequest(b *testing.B) {
	p := newPKI(b, nil)
	m := newManager(b, p, nil)
	if _, err := m.Secret(context.Background(), dflt); err != nil {
		b.Fatal(err)
	}
	h := start(b, m, quiet)
	for _, tc := range []struct {
		api string
		n   int
	}{{"sotw", 40000}, {"delta", 40000}, {"fetch", 40000}, {"sotw", sdsserver.DefaultMaxResourceNames}} {
		b.Run(fmt.Sprintf("%s/names=%d", tc.api, tc.n), func(b *testing.B) {
			ns := append(names("file-root:/etc/certs/no-such", tc.n-1), dflt)
			refused := tc.n > sdsserver.DefaultMaxResourceNames
			b.ReportAllocs()
			c0 := cpuTime()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
				var err error
				switch tc.api {
				case "sotw":
					s, serr := h.client.StreamSecrets(ctx)
					if serr != nil {
						b.Fatal(serr)
					}
					if err = s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: ns}); err == nil {
						_, err = s.Recv()
					}
				case "delta":
					s, serr := h.client.DeltaSecrets(ctx)
					if serr != nil {
						b.Fatal(serr)
					}
					if err = s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNamesSubscribe: ns}); err == nil {
						_, err = s.Recv()
					}
				case "fetch":
					_, err = h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: ns})
				}
				cancel()
				if refused && status.Code(err) != codes.ResourceExhausted {
					b.Fatalf("%d names: %v, want ResourceExhausted", tc.n, err)
				}
				if !refused && err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// BenchmarkUniq is the de-duplication of a request's names (the scan it
// replaced took 32 s for 100,000 names).
func BenchmarkUniq(b *testing.B) {
	ns := names("name", 100000)
	b.ReportAllocs()
	for b.Loop() {
		if len(sdsserver.Uniq(ns)) != len(ns) {
			b.Fatal("lost names")
		}
	}
}
