package sdsserver_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

// 1,000 streams opened at once on a fresh agent cause exactly one CSR, and
// all receive the same certificate. End to end: the CA server sees one
// CreateCertificate call.
func TestThousandStreamsOneCSR(t *testing.T) {
	cas := newCAStack(t)
	h := start(t, cas.m)
	const streams, conns = 1000, 8
	clients := make([]secretv3.SecretDiscoveryServiceClient, conns)
	for i := range clients {
		clients[i] = secretv3.NewSecretDiscoveryServiceClient(dial(t, h.path))
	}
	versions := make(chan string, streams)
	errs := make(chan error, streams)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
			defer cancel()
			s, err := clients[i%conns].StreamSecrets(ctx)
			if err != nil {
				errs <- err
				return
			}
			<-start
			if err := s.Send(sotwRequest(fmt.Sprintf("node-%d", i), dflt)); err != nil {
				errs <- err
				return
			}
			r, err := s.Recv()
			if err != nil {
				errs <- err
				return
			}
			versions <- r.GetVersionInfo()
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	close(versions)
	seen := map[string]int{}
	for v := range versions {
		seen[v]++
	}
	if len(seen) != 1 {
		t.Errorf("streams got %d different versions: %v", len(seen), seen)
	}
	if n := cas.csrs.Load(); n != 1 {
		t.Errorf("%d CSRs for %d streams, want 1", n, streams)
	}
	if n := testkit.Metric(t, cas.reg, "meshid_ca_requests_total", "code", "OK"); n != 1 {
		t.Errorf("the CA answered %v CreateCertificate calls, want 1", n)
	}
}

// A client that vanishes leaves nothing behind: its streams end, its
// watches are cancelled, no goroutine of ours remains, and other streams
// are unaffected.
func TestAbruptDisconnect(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, _ := e.later(t)
		survivor := h.withDefault(t)
		survivor.ack()

		const streams = 20
		conn := dial(t, h.path)
		client := secretv3.NewSecretDiscoveryServiceClient(conn)
		for i := range streams {
			if i%2 == 0 {
				s := newSotw(t, client, nil)
				s.request(dflt, root, later)
				s.recvNamed(dflt, root)
			} else {
				d := newDelta(t, client, nil)
				d.absent = map[string]bool{later: true}
				d.change([]string{dflt, root, later}, nil)
				d.recvNames(dflt, root)
			}
		}
		if n := h.metric(t, "meshid_agent_sds_streams"); n != streams+1 {
			t.Fatalf("streams = %v, want %d", n, streams+1)
		}
		conn.Close() // no goodbye: the transport just goes away
		h.logs.WaitFor(t, "SDS stream closed", streams)

		h.wantMetric(t, 1, "meshid_agent_sds_streams")
		for _, name := range []string{root, later} {
			if n := e.watchers(name); n != 0 {
				t.Errorf("%d watches left on %s", n, name)
			}
		}
		waitNoGoroutines(t, "sds.(*stream)", "sds.(*Server).StreamSecrets", "sds.(*Server).DeltaSecrets", "sds.(*topic)", "sds.(*hub)")
		// Other streams are unaffected.
		e.rotate(t)
		if s := survivor.recvSecret(); s.GetName() != dflt {
			t.Fatalf("survivor got %q", s.GetName())
		}
	})
}

// waitNoGoroutines waits until no goroutine's stack has any of frames,
// except the survivor's handler which is counted separately.
func waitNoGoroutines(t *testing.T, frames ...string) {
	t.Helper()
	deadline := time.Now().Add(testkit.Guard)
	for {
		stacks := goroutineStacks()
		var bad []string
		for _, g := range stacks {
			for _, f := range frames {
				if strings.Contains(g, f) {
					bad = append(bad, g)
					break
				}
			}
		}
		// One handler (the survivor's) is expected.
		if len(bad) <= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of ours left:\n%s", len(bad), strings.Join(bad, "\n\n"))
		}
		runtime.Gosched()
	}
}

func goroutineStacks() []string {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	return strings.Split(b.String(), "\n\n")
}

func sotwRequest(node string, names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: names, Node: &corev3.Node{Id: node}}
}
