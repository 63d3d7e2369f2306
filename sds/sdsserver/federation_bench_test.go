package sdsserver_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/metadata"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/workloadendpoint"
	"github.com/meshid/meshid/testkit"
)

// benchFederation is the CA's FetchFederatedBundles for the benchmark:
// each call answers the current of two bundles of b.example.
type benchFederation struct {
	answers [2]map[string][]byte
	cur     atomic.Int32
}

func (f *benchFederation) FetchFederatedBundles(context.Context) (map[string][]byte, error) {
	return f.answers[f.cur.Load()], nil
}

// BenchmarkFederatedBundlePush measures one change of a federated bundle,
// from the agent's poll of the CA to every stream having received it:
// 1,000 Workload API FetchX509SVID streams and 1,000 SDS streams on
// ROOTCA_FEDERATED (ACKed as Envoy does), over 8 connections each, on one
// agent's SecretManager.
//
//	go test -run '^$' -bench FederatedBundlePush -benchtime 50x ./sds/sdsserver
func BenchmarkFederatedBundlePush(b *testing.B) {
	const streams, conns = 1000, 8
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	tdB := spiffeid.RequireTrustDomainFromString("b.example")
	fed := &benchFederation{}
	for i := range fed.answers {
		root := newPKI(b, clk).roots()
		data, err := spiffebundle.FromX509Authorities(tdB, []*x509.Certificate{root[0]}).Marshal()
		if err != nil {
			b.Fatal(err)
		}
		fed.answers[i] = map[string][]byte{tdB.IDString(): data}
	}
	m, err := secretcache.New(secretcache.Config{
		Signer: testkit.AuthoritySigner{Authority: testkit.NewAuthority(b, td, clk, nil)},
		ID:     spiffeid.RequireFromPath(td, "/ns/default/sa/app"), TTL: time.Hour, Jitter: -1,
		Federation: fed, Clock: clk,
	})
	if err != nil {
		b.Fatal(err)
	}
	h := start(b, m, withClock(clk), quiet)
	wlPath := filepath.Join(testkit.ShortDir(b), "wl.sock")
	wl, err := workloadendpoint.New(workloadendpoint.Config{Source: m, SocketPath: wlPath, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	if err := wl.Listen(); err != nil {
		b.Fatal(err)
	}
	testkit.Run(b, "agent", m.Run, wl.Run)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	got := make(chan struct{}, 2*streams)
	sdsClients := make([]secretv3.SecretDiscoveryServiceClient, conns)
	wlClients := make([]workloadpb.SpiffeWorkloadAPIClient, conns)
	for i := range conns {
		sdsClients[i] = secretv3.NewSecretDiscoveryServiceClient(dial(b, h.path))
		wlClients[i] = workloadpb.NewSpiffeWorkloadAPIClient(testkit.DialUnix(b, wlPath))
	}
	wctx := metadata.AppendToOutgoingContext(ctx, workloadendpoint.MetadataKey, "true")
	for i := range streams {
		s, err := sdsClients[i%conns].StreamSecrets(ctx)
		if err != nil {
			b.Fatal(err)
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{secretcache.FederatedRootName}, Node: &corev3.Node{Id: fmt.Sprintf("sidecar~10.0.0.1~p%d.default~default.svc.cluster.local", i)}}
		if err := s.Send(req); err != nil {
			b.Fatal(err)
		}
		w, err := wlClients[i%conns].FetchX509SVID(wctx, &workloadpb.X509SVIDRequest{})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				r, err := s.Recv()
				if err != nil {
					return
				}
				ack := &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: req.ResourceNames, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}
				if s.Send(ack) != nil {
					return
				}
				got <- struct{}{}
			}
		})
		wg.Go(func() {
			for {
				if _, err := w.Recv(); err != nil {
					return
				}
				got <- struct{}{}
			}
		})
	}
	wait := func() {
		timeout := time.After(testkit.Guard)
		for range 2 * streams {
			select {
			case <-got:
			case <-timeout:
				b.Fatal("not every stream received the bundle")
			}
		}
	}
	wait() // the first answers
	idle := clk.Waiters()
	b.ResetTimer()
	for n := 0; b.Loop(); n++ {
		testkit.WaitForTimers(b, clk, idle, "the agent's timers")
		fed.cur.Store(int32((n + 1) % 2))
		clk.Add(secretcache.DefaultFederationRefresh)
		wait()
	}
}
