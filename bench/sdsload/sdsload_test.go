package sdsload_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/bench/latency"
	"github.com/meshid/meshid/bench/sdsload"
	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

var testID = spiffeid.RequireFromString("spiffe://cluster.local/ns/bench/sa/bench-0")

// agent is a real SecretManager behind a real SDS server on a Unix socket.
type agent struct {
	socket  string
	manager *secretcache.Manager
}

func startAgent(t *testing.T) *agent {
	t.Helper()
	return startAgentWith(t, nil)
}

// startAgentWith is startAgent with the SDS server's Source wrapped by wrap
// (nil: the SecretManager itself).
func startAgentWith(t *testing.T, wrap func(sdsserver.Source) sdsserver.Source) *agent {
	t.Helper()
	bundle, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := ca.New(ca.Config{TrustDomain: testID.TrustDomain(), Bundle: bundle, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := secretcache.New(secretcache.Config{Signer: testkit.AuthoritySigner{Authority: auth, Caller: "bench test"}, ID: testID, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sdsload") // a short path: sun_path holds 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var src sdsserver.Source = m
	if wrap != nil {
		src = wrap(m)
	}
	srv, err := sdsserver.New(sdsserver.Config{Source: src, SocketPath: filepath.Join(dir, "sds.sock")})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- m.Run(ctx) }()
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		}
	})
	return &agent{socket: srv.SocketPath(), manager: m}
}

func TestRunOpensStreamsAndMeasuresRotation(t *testing.T) {
	tests := []struct {
		name    string
		streams int
		perConn int
		open    int
		rotate  bool
		wantCon int
	}{
		{name: "all at once over several connections", streams: 25, perConn: 10, wantCon: 3},
		{name: "one at a time", streams: 5, open: 1, wantCon: 1},
		{name: "rotation", streams: 30, perConn: 7, rotate: true, wantCon: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := startAgent(t)
			cfg := sdsload.Config{Socket: a.socket, Streams: tt.streams, StreamsPerConn: tt.perConn, OpenConcurrency: tt.open, PID: os.Getpid()}
			var rotations int
			if tt.rotate {
				cfg.Rotate = func(ctx context.Context) error { rotations++; return a.manager.Rotate(ctx) }
			}
			l, err := sdsload.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rep, err := l.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Streams != tt.streams || rep.Ready != tt.streams || rep.Failed != 0 || rep.Connections != tt.wantCon {
				t.Errorf("report = %+v", rep)
			}
			if rep.TimeToReady.Count != tt.streams || rep.TimeToReady.Max <= 0 || rep.AllReady < rep.TimeToReady.Max {
				t.Errorf("time to ready = %+v, all ready %v", rep.TimeToReady, rep.AllReady)
			}
			if rep.Memory == nil || rep.Memory.Before == 0 || rep.Memory.After == 0 {
				t.Errorf("memory = %+v", rep.Memory)
			}
			if !tt.rotate {
				if rep.Rotation != nil {
					t.Errorf("rotation without Rotate: %+v", rep.Rotation)
				}
				return
			}
			if rotations != 1 || rep.Rotation == nil {
				t.Fatalf("rotations = %d, report %+v", rotations, rep.Rotation)
			}
			r := rep.Rotation
			if r.Streams != tt.streams || r.Rotated != tt.streams || r.Latency.Count != tt.streams || r.All < r.Latency.Max || r.All <= 0 {
				t.Errorf("rotation = %+v", r)
			}
			if rep.Memory.AfterRotation == 0 {
				t.Errorf("no RSS after rotation")
			}
		})
	}
}

// openGate is the agent's Source, counting the streams whose first fetch
// of the certificate is in flight at once. Each fetch is held until another
// stream's fetch arrives beside it or hold has passed, so that streams the
// tool opens together are seen together at the agent.
type openGate struct {
	sdsserver.Source
	hold time.Duration

	mu       sync.Mutex
	inFlight int
	max      int
	arrived  chan struct{} // closed and replaced on each arrival
}

func (g *openGate) Secret(ctx context.Context, name string) (*secretcache.Secret, error) {
	if name != secretcache.DefaultName {
		return g.Source.Secret(ctx, name)
	}
	g.mu.Lock()
	g.inFlight++
	g.max = max(g.max, g.inFlight)
	close(g.arrived)
	g.arrived = make(chan struct{})
	next := g.arrived
	g.mu.Unlock()
	timer := time.NewTimer(g.hold)
	select {
	case <-next:
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	g.mu.Lock()
	g.inFlight--
	g.mu.Unlock()
	return g.Source.Secret(ctx, name)
}

// TestOpenConcurrencySerialisesOpens: with OpenConcurrency 1 (the
// `--open-concurrency 1` of the "cached default to a new stream" figure)
// the agent never sees two streams opening at once; without it, it does.
// The hold is a bound for the unlimited case to show itself, not a wait the
// limited case depends on: there no second fetch comes while one is held.
func TestOpenConcurrencySerialisesOpens(t *testing.T) {
	for _, tc := range []struct {
		name    string
		open    int
		serial  bool
		streams int
	}{
		{"open concurrency 1", 1, true, 4},
		{"unlimited", 0, false, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &openGate{hold: 250 * time.Millisecond, arrived: make(chan struct{})}
			a := startAgentWith(t, func(src sdsserver.Source) sdsserver.Source { g.Source = src; return g })
			l, err := sdsload.New(sdsload.Config{Socket: a.socket, Streams: tc.streams, OpenConcurrency: tc.open, PID: os.Getpid()})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := l.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Ready != tc.streams {
				t.Fatalf("%d of %d streams ready", rep.Ready, tc.streams)
			}
			g.mu.Lock()
			most := g.max
			g.mu.Unlock()
			if tc.serial && most != 1 {
				t.Fatalf("with OpenConcurrency %d the agent saw %d streams opening at once", tc.open, most)
			}
			if !tc.serial && most < 2 {
				t.Fatalf("without OpenConcurrency the agent saw at most %d stream opening at once", most)
			}
		})
	}
}

func TestRunTimesOutWhenAResourceNeverComes(t *testing.T) {
	a := startAgent(t)
	clk := clock.NewFake(time.Unix(1e9, 0))
	l, err := sdsload.New(sdsload.Config{
		Socket: a.socket, Streams: 3, Resources: []string{"default", "file-root:/nonexistent/root.pem"},
		Timeout: time.Minute, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := testkit.Go(func() (*sdsload.Report, error) { return l.Run(context.Background()) })
	stop := make(chan struct{})
	defer close(stop)
	clk.WaitForWaiters(1, stop) // Run waits for the streams
	clk.Add(time.Minute)
	res := <-done
	if res.Err == nil || !strings.Contains(res.Err.Error(), "timed out after 1m0s") {
		t.Fatalf("err = %v, want a time-out", res.Err)
	}
	if res.Value == nil || res.Value.Ready != 0 || res.Value.Streams != 3 || res.Value.Failed != 0 {
		t.Errorf("report = %+v", res.Value)
	}
}

func TestRunWithoutAgent(t *testing.T) {
	l, err := sdsload.New(sdsload.Config{Socket: filepath.Join(t.TempDir(), "none.sock"), Streams: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "connecting to") {
		t.Errorf("err = %v, want a connection failure", err)
	}
}

func TestNewRejects(t *testing.T) {
	rot := func(context.Context) error { return nil }
	tests := []struct {
		name string
		cfg  sdsload.Config
		want string
	}{
		{"no socket", sdsload.Config{Streams: 1}, "no socket"},
		{"no streams", sdsload.Config{Socket: "s"}, "must be positive"},
		{"negative", sdsload.Config{Socket: "s", Streams: 1, StreamsPerConn: -1}, "negative"},
		{"duplicate names", sdsload.Config{Socket: "s", Streams: 1, Resources: []string{"a", "a"}}, "distinct"},
		{"rotation of an unsubscribed name", sdsload.Config{Socket: "s", Streams: 1, Resources: []string{"ROOTCA"}, Rotate: rot}, "not subscribed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := sdsload.New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "sdsload: ") {
				t.Errorf("error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestHTTPRotate(t *testing.T) {
	var posts int
	ok := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != sdsload.RotatePath {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		posts++
		if !ok {
			http.Error(w, "CA unavailable", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	rotate := sdsload.HTTPRotate(srv.Client(), strings.TrimPrefix(srv.URL, "http://"))
	if err := rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ok = false
	err := rotate(context.Background())
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "CA unavailable") {
		t.Errorf("err = %v, want the 503 and its message", err)
	}
	if posts != 2 {
		t.Errorf("posts = %d, want 2", posts)
	}
}

func TestRSS(t *testing.T) {
	rss, err := sdsload.RSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Errorf("RSS = %d, %v", rss, err)
	}
	if _, err := sdsload.RSS(1 << 30); err == nil {
		t.Errorf("RSS of a missing process succeeded")
	}
}

func TestReportJSONAndTable(t *testing.T) {
	ms := time.Millisecond
	rep := &sdsload.Report{
		Streams: 100, Connections: 1, Resources: []string{"default", "ROOTCA"}, Ready: 100,
		TimeToReady: latency.Summary{Count: 100, P50: ms, P90: 2 * ms, P99: 3 * ms, Max: 4 * ms},
		AllReady:    50 * ms, GCCycles: 2,
		Slowest: []sdsload.StreamTiming{{Stream: 7, At: 20 * ms, Open: ms / 10, Request: ms / 100, FirstResponse: 3 * ms,
			Rest: ms / 50, Total: 4 * ms, GCCycles: 1}},
		Memory:   &sdsload.Memory{PID: 42, Before: 10 << 20, After: 12 << 20, AfterRotation: 13 << 20},
		Rotation: &sdsload.Rotation{Streams: 100, Rotated: 100, Latency: latency.Summary{Count: 100, P50: 5 * ms, Max: 9 * ms}, All: 9 * ms},
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	mem := got["memory"].(map[string]any)
	rot := got["rotation"].(map[string]any)
	if got["ready"] != 100.0 || got["all_ready_ms"] != 50.0 || mem["per_stream_bytes"] != 20971.0 ||
		rot["rotated"] != 100.0 || got["gc_cycles"] != 2.0 ||
		got["slowest"].([]any)[0].(map[string]any)["first_response_ms"] != 3.0 || rot["all_ms"] != 9.0 || got["time_to_ready"].(map[string]any)["p99_ms"] != 3.0 {
		t.Errorf("JSON = %s", b)
	}
	var sb strings.Builder
	if err := rep.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	const want = `STREAMS           100 over 1 connections, each subscribing default, ROOTCA
READY             100/100 (0 failed)
TIME TO READY     p50 1.00ms  p90 2.00ms  p99 3.00ms  max 4.00ms (all ready after 50.0ms)
LOAD GC           2 collections of this process while the streams opened
SLOW STREAM       #7 at 20.0ms: 4.00ms = open 100µs + request 10.0µs + first response 3.00ms + rest 20.0µs; load GC 1
AGENT RSS         before 10.0 MiB, with streams open 12.0 MiB (+20.5 KiB/stream), after rotation 13.0 MiB
ROTATION          100/100 streams got the new certificate, the last after 9.00ms
ROTATION LATENCY  p50 5.00ms  p90 0  p99 0  max 9.00ms
`
	if sb.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", sb.String(), want)
	}
	rep.Memory, rep.Rotation = nil, nil
	sb.Reset()
	if err := rep.WriteTable(&sb); err != nil || !strings.Contains(sb.String(), "not measured") {
		t.Errorf("table without memory: %v\n%s", err, sb.String())
	}
	if b, _ := json.Marshal(rep); strings.Contains(string(b), "memory") || strings.Contains(string(b), "rotation") {
		t.Errorf("JSON without memory or rotation: %s", b)
	}
}

// TestHoldGC: with HoldGC the load's garbage collector stays off while the
// streams open, and the process's settings come back afterwards; without
// it, the same run collects (GOGC=1 here makes every run collect often), and
// the report counts those collections.
func TestHoldGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold %v", hold), func(t *testing.T) {
			a := startAgent(t)
			l, err := sdsload.New(sdsload.Config{Socket: a.socket, Streams: 200, OpenConcurrency: 1, HoldGC: hold, HoldGCLimit: 512 << 20})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := l.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Ready != 200 {
				t.Fatalf("%d of 200 streams ready", rep.Ready)
			}
			if hold && rep.GCCycles != 0 {
				t.Errorf("with HoldGC the process collected %d times while the streams opened", rep.GCCycles)
			}
			if !hold && rep.GCCycles == 0 {
				t.Errorf("at GOGC=1 without HoldGC the report counts no collection")
			}
			if p := debug.SetGCPercent(1); p != 1 {
				t.Errorf("GOGC after the run = %d, want 1 back", p)
			}
			if lim := debug.SetMemoryLimit(-1); lim != math.MaxInt64 {
				t.Errorf("memory limit after the run = %d, want none", lim)
			}
		})
	}
}

// stuckFirst is the agent's Source, holding the first fetch of the
// certificate until release is closed.
type stuckFirst struct {
	sdsserver.Source
	once             sync.Once
	arrived, release chan struct{}
}

func (s *stuckFirst) Secret(ctx context.Context, name string) (*secretcache.Secret, error) {
	if name == secretcache.DefaultName {
		s.once.Do(func() {
			close(s.arrived)
			select {
			case <-s.release:
			case <-ctx.Done():
			}
		})
	}
	return s.Source.Secret(ctx, name)
}

// TestOpenConcurrencyStartsStreamsInTurn: with OpenConcurrency 1 a stream's
// goroutine starts only when the one before it is ready; while the first
// stream waits for its certificate, no other exists (and HoldGC holds the
// collector off, with the default memory limit). (It used to start
// every stream's goroutine at once, parked on the slots, and the first
// streams shared the CPUs with them.)
func TestOpenConcurrencyStartsStreamsInTurn(t *testing.T) {
	s := &stuckFirst{arrived: make(chan struct{}), release: make(chan struct{})}
	a := startAgentWith(t, func(src sdsserver.Source) sdsserver.Source { s.Source = src; return s })
	const n = 50
	l, err := sdsload.New(sdsload.Config{Socket: a.socket, Streams: n, OpenConcurrency: 1, HoldGC: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := testkit.Go(func() (*sdsload.Report, error) { return l.Run(ctx) })
	select {
	case <-s.arrived:
	case res := <-done:
		t.Fatalf("Run ended before the first stream asked for its certificate: %v", res.Err)
	}
	got := streamGoroutines(t)
	// Meanwhile HoldGC holds the collector off under the default limit.
	limit := debug.SetMemoryLimit(-1)
	percent := debug.SetGCPercent(-1)
	debug.SetGCPercent(percent)
	close(s.release)
	if res := <-done; res.Err != nil || res.Value.Ready != n {
		t.Fatalf("Run = %+v, %v", res.Value, res.Err)
	}
	if got != 1 {
		t.Errorf("%d stream goroutines while the first stream opened, want 1", got)
	}
	if limit != sdsload.DefaultHoldGCLimit || percent != -1 {
		t.Errorf("during the run: memory limit %d, GOGC %d; want %d and off", limit, percent, sdsload.DefaultHoldGCLimit)
	}
}

// streamGoroutines counts the goroutines running sdsload's per-stream loop.
func streamGoroutines(t *testing.T) int {
	t.Helper()
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		t.Fatal(err)
	}
	return strings.Count(b.String(), "sdsload.(*Loader).stream(")
}

// slowFetch is the agent's Source; its nth fetch of the certificate moves
// the load's fake clock by delay, as if the agent took that long to answer.
type slowFetch struct {
	sdsserver.Source
	clk   *clock.Fake
	nth   int
	delay time.Duration

	mu    sync.Mutex
	count int
}

func (s *slowFetch) Secret(ctx context.Context, name string) (*secretcache.Secret, error) {
	if name == secretcache.DefaultName {
		s.mu.Lock()
		s.count++
		if s.count == s.nth {
			s.clk.Add(s.delay)
		}
		s.mu.Unlock()
	}
	return s.Source.Secret(ctx, name)
}

// TestSlowestStreams: the report lists the slowest streams with where
// their time went; an agent slow to answer one stream's first request shows
// as that stream's first response.
func TestSlowestStreams(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	s := &slowFetch{clk: clk, nth: 3, delay: 5 * time.Millisecond}
	a := startAgentWith(t, func(src sdsserver.Source) sdsserver.Source { s.Source = src; return s })
	l, err := sdsload.New(sdsload.Config{Socket: a.socket, Streams: 6, OpenConcurrency: 1, Slowest: 2, Clock: clk, HoldGC: true})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Slowest) != 2 {
		t.Fatalf("slowest = %+v, want 2", rep.Slowest)
	}
	got := rep.Slowest[0]
	want := sdsload.StreamTiming{Stream: 2, FirstResponse: 5 * time.Millisecond, Total: 5 * time.Millisecond}
	if got != want {
		t.Errorf("slowest stream = %+v, want %+v", got, want)
	}
	if rep.Slowest[1].Total != 0 || rep.TimeToReady.Max != 5*time.Millisecond {
		t.Errorf("second slowest = %+v, max %v", rep.Slowest[1], rep.TimeToReady.Max)
	}
}
