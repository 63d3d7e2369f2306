package agent_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/rootfile"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// heldCA is the agent's real CA client (caclient, to the world's real CA)
// behind a valve on MintJWTSVID: while held, a JWT-SVID request waits for
// the valve or its context, as behind a CA slower than its callers, the
// condition the attack of issue 28 creates. inside counts the requests
// waiting at the valve.
type heldCA struct {
	*caclient.Client
	mu     sync.Mutex
	open   chan struct{}
	inside atomic.Int64
}

func (h *heldCA) valve() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open
}

func (h *heldCA) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.open = make(chan struct{})
}

func (h *heldCA) release() { close(h.valve()) }

func (h *heldCA) MintJWTSVID(ctx context.Context, id spiffeid.ID, aud []string) (string, error) {
	h.inside.Add(1)
	defer h.inside.Add(-1)
	select {
	case <-h.valve():
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return h.Client.MintJWTSVID(ctx, id, aud)
}

// client is a CA client of w, as the agent builds it.
func (w *world) client(t *testing.T, addr string) *caclient.Client {
	t.Helper()
	roots, err := rootfile.Read(w.rootFile, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := caclient.New(caclient.Config{Addr: addr, Roots: roots, TokenFile: w.tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wlClients are n connections to the Workload API socket at path.
func wlClients(t *testing.T, path string, n int) []workloadpb.SpiffeWorkloadAPIClient {
	t.Helper()
	cs := make([]workloadpb.SpiffeWorkloadAPIClient, n)
	for i := range cs {
		cs[i] = workloadpb.NewSpiffeWorkloadAPIClient(testkit.DialUnix(t, path))
	}
	return cs
}

func wlCtx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true")
}

func caMints(t *testing.T, w *world) float64 {
	t.Helper()
	return testkit.Metric(t, w.caReg, "meshid_ca_jwtsvid_issued_total")
}

// spin polls cond until it holds or testkit.Guard passes, and reports
// which; it waits for goroutines to reach a state nothing signals, and
// never sleeps.
func spin(cond func() bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		default:
			runtime.Gosched()
		}
	}
	return true
}

// Issue 28, hole 1, through the agent assembly in front of a real CA: 2,000
// FetchJWTSVID calls with distinct audiences while the CA is slower than
// they come (held), from callers that all give up at once. Before the fix
// every call started a detached request that waited for one of the 16 CA
// slots and asked the CA after its caller had left: the goroutines stayed
// (one per call) and the CA minted for nobody. Now at most
// DefaultMaxJWTFlights requests wait and the other calls are refused at once
// with ResourceExhausted; when the callers leave, their requests are
// cancelled, the goroutines go, and the CA is never asked for them.
func TestJWTFloodThroughAgent(t *testing.T) {
	const calls, conns = 2000, 8
	w := newWorld(t)
	held := &heldCA{Client: w.client(t, w.ca.Addr().String()), open: make(chan struct{})}
	held.release()
	cfg := w.config()
	cfg.Signer = held
	cfg.WorkloadAPISocket = filepath.Join(testkit.ShortDir(t), "wl.sock")
	a := testkit.RunAgent(t, cfg)
	firstSecret(t, a)
	cs := wlClients(t, cfg.WorkloadAPISocket, conns)
	for i, c := range cs { // connections up, JWT bundle fetched
		if _, err := c.FetchJWTSVID(wlCtx(t.Context()), &workloadpb.JWTSVIDRequest{Audience: []string{"warm"}}); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	if n := caMints(t, w); n != 1 {
		t.Fatalf("the CA minted %v JWT-SVIDs for one audience, want 1", n)
	}
	baseGoroutines := runtime.NumGoroutine()

	held.hold()
	ctx, cancel := context.WithCancel(wlCtx(context.Background()))
	defer cancel()
	var refused, boundMsg atomic.Int64
	done := make(chan codes.Code, calls)
	for i := range calls {
		go func() {
			_, err := cs[i%conns].FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{fmt.Sprint("aud-", i)}})
			if status.Code(err) == codes.ResourceExhausted {
				refused.Add(1)
				if strings.Contains(err.Error(), "distinct audience sets") {
					boundMsg.Add(1)
				}
			}
			done <- status.Code(err)
		}()
	}
	// All but DefaultMaxJWTFlights calls are refused at once.
	const bound = secretcache.DefaultMaxJWTFlights
	if !spin(func() bool { return refused.Load() == calls-bound }) {
		t.Errorf("%d of %d calls refused with ResourceExhausted while the CA is slow, want all but %d", refused.Load(), calls, bound)
	}
	if boundMsg.Load() == 0 && refused.Load() > 0 {
		t.Errorf("no refusal names the bound on JWT-SVID requests")
	}
	cancel() // every caller gives up at once
	for range calls {
		if c := <-done; c != codes.ResourceExhausted && c != codes.Canceled {
			t.Errorf("a call ended with %v", c)
		}
	}
	// Nothing waits for the CA once its callers left.
	if !spin(func() bool { return runtime.NumGoroutine() <= baseGoroutines+20 }) {
		t.Errorf("%d goroutines after every caller left, %d before the flood", runtime.NumGoroutine(), baseGoroutines)
	}
	// Every request the flood started has left the held CA before it
	// opens: the goroutine count above allows a few stragglers, and a
	// straggler still waiting at the valve when it opens would reach the
	// CA (seen once under load: 3 mints).
	if !spin(func() bool { return held.inside.Load() == 0 }) {
		t.Errorf("%d requests still wait for the CA after every caller left", held.inside.Load())
	}
	held.release()
	if _, err := cs[0].FetchJWTSVID(wlCtx(t.Context()), &workloadpb.JWTSVIDRequest{Audience: []string{"after"}}); err != nil {
		t.Fatalf("a call after the flood: %v", err)
	}
	if n := caMints(t, w); n != 2 {
		t.Errorf("the CA minted %v JWT-SVIDs, want 2 (the warm-up and the call after the flood): none for callers that left", n)
	}
}

// Issue 28, hole 1: with the CA unreachable, 1,000 FetchJWTSVID calls
// through the agent assembly write logs.WarnBurst (5) warnings, not one per
// call (98,547 for 100,000 before the fix). The JWT requests go through a
// real CA client to an address where nothing listens.
func TestJWTFailureWarningsThroughAgent(t *testing.T) {
	const calls = 1000
	w := newWorld(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	signer := &deadJWT{Client: w.client(t, w.ca.Addr().String()), jwt: w.client(t, deadAddr)}
	rec := testkit.NewLogRecorder()
	cfg := w.config()
	cfg.Signer = signer
	cfg.WorkloadAPISocket = filepath.Join(testkit.ShortDir(t), "wl.sock")
	cfg.Logger = rec.Logger()
	cfg.Clock = clock.NewFake(time.Now()) // the throttle's minute never passes
	a := testkit.RunAgent(t, cfg)
	firstSecret(t, a)
	c := wlClients(t, cfg.WorkloadAPISocket, 1)[0]
	if _, err := c.FetchJWTBundles(wlCtx(t.Context()), &workloadpb.JWTBundlesRequest{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.FetchJWTSVID(wlCtx(t.Context()), &workloadpb.JWTSVIDRequest{Audience: []string{fmt.Sprint("aud-", i%300)}})
			if code := status.Code(err); code != codes.Unavailable && code != codes.ResourceExhausted {
				t.Errorf("call %d with the CA unreachable: %v", i, err)
			}
		}()
		if i%16 == 15 {
			wg.Wait()
		}
	}
	wg.Wait()
	if n := rec.Count("JWT-SVID request failed"); n != logs.WarnBurst {
		t.Fatalf("%d warnings for %d failed JWT-SVID requests, want %d", n, calls, logs.WarnBurst)
	}
	if n := rec.CountContaining("JWT request failed"); n > logs.WarnBurst {
		t.Fatalf("%d Workload API warnings for %d failed requests", n, calls)
	}
}

// deadJWT is the real CA client for certificates and a real CA client to
// a dead address for JWT-SVIDs.
type deadJWT struct {
	*caclient.Client
	jwt *caclient.Client
}

func (d *deadJWT) MintJWTSVID(ctx context.Context, id spiffeid.ID, aud []string) (string, error) {
	return d.jwt.MintJWTSVID(ctx, id, aud)
}
