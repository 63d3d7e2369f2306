package testkit_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// recorder is a testing.TB that records failures instead of failing the
// test, so that the helpers' own failures can be checked.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recorder) failures() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errors, "\n")
}

// call runs fn with a recorder on its own goroutine (Fatalf ends it).
func call(t *testing.T, fn func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

func TestMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"code", "kind"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("OK", "a").Add(2)
	c.WithLabelValues("OK", "b").Add(3)
	c.WithLabelValues("Unavailable", "a").Add(5)
	g.Set(-7)
	h.Observe(1)
	h.Observe(2)
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"one labelled sample", "c_total", []string{"code", "Unavailable"}, 5},
		{"all labels", "c_total", []string{"code", "OK", "kind", "b"}, 3},
		{"gauge", "g", nil, -7},
		{"histogram count", "h_seconds", nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testkit.Metric(t, reg, tt.metric, tt.labels...); got != tt.want {
				t.Errorf("Metric = %v, want %v", got, tt.want)
			}
		})
	}
	for _, absent := range [][]string{{"nope"}, {"c_total", "code", "PermissionDenied"}} {
		r := call(t, func(tb testing.TB) { testkit.Metric(tb, reg, absent[0], absent[1:]...) })
		if !strings.Contains(r.failures(), "not found") {
			t.Errorf("Metric(%v) of an absent sample: failures %q, want not found", absent, r.failures())
		}
	}
}

func TestStartChecksRunErrors(t *testing.T) {
	ok := func(ctx context.Context) error { <-ctx.Done(); return nil }
	bad := func(ctx context.Context) error { <-ctx.Done(); return errors.New("boom") }
	r := call(t, func(tb testing.TB) {
		stop := testkit.Start(tb, "pair", ok, bad)
		stop()
		stop() // idempotent
	})
	if got := r.failures(); got != "pair: Run: boom" {
		t.Errorf("failures %q, want one for the failing run", got)
	}
	r = call(t, func(tb testing.TB) { testkit.Start(tb, "fine", ok, ok)() })
	if got := r.failures(); got != "" {
		t.Errorf("failures %q for runs returning nil", got)
	}
}

func TestLogRecorder(t *testing.T) {
	l := testkit.NewLogRecorder()
	log := slog.New(l).With("api", "sotw")
	go func() {
		for i := range 3 {
			log.Info("stream closed", "n", i)
		}
		slog.New(l).Warn("other")
	}()
	l.WaitFor(t, "stream closed api=sotw", 3)
	l.WaitFor(t, "other", 1)
	if n := l.Count("stream closed"); n != 3 {
		t.Errorf("Count = %d, want 3", n)
	}
	if n := l.Count("closed"); n != 0 {
		t.Errorf("Count matched a record not starting with the prefix")
	}
	if all := l.All(); !strings.Contains(all, "stream closed api=sotw n=2") {
		t.Errorf("All lacks the attributes:\n%s", all)
	}
}

func TestServeUnix(t *testing.T) {
	path := testkit.ServeUnix(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) })
	if len(path) > 107 {
		t.Fatalf("socket path %d bytes long: %s", len(path), path)
	}
	resp, err := healthpb.NewHealthClient(testkit.DialUnix(t, path)).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check = %v, %v", resp, err)
	}
}

func TestGoDeliversResults(t *testing.T) {
	want := errors.New("boom")
	r := <-testkit.Go(func() (int, error) { return 7, want })
	if r.Value != 7 || r.Err != want {
		t.Fatalf("Go result = %+v, want {7 boom}", r)
	}
}

// TestHTTP: HTTP returns the status and body of the method asked, and fails
// the test when nothing answers.
func TestHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, r.Method+" "+r.URL.Path)
	}))
	defer srv.Close()
	if code, body := testkit.HTTP(t, http.MethodPost, srv.URL+"/debug/rotate"); code != http.StatusTeapot || body != "POST /debug/rotate" {
		t.Fatalf("HTTP = %d %q", code, body)
	}
	srv.Close()
	r := call(t, func(tb testing.TB) { testkit.HTTP(tb, http.MethodGet, srv.URL+"/readyz") })
	if !strings.Contains(r.failures(), "connect") {
		t.Fatalf("a request to a closed server did not fail the test: %q", r.failures())
	}
}

// TestClockWaits: WaitForTimers returns once the timers are set, and
// NextDeadline returns the earliest. (Their failure takes Guard, 30s, so it
// is not tested here.)
func TestClockWaits(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	go func() {
		clk.NewTimer(2 * time.Hour)
		clk.NewTimer(time.Hour)
	}()
	testkit.WaitForTimers(t, clk, 2, "two timers")
	if d := testkit.NextDeadline(t, clk, "a timer"); !d.Equal(time.Unix(1e9, 0).Add(time.Hour)) {
		t.Fatalf("NextDeadline = %v", d)
	}
}

// TestStaysOutOfBinaries: the production binaries link neither testkit
// (test helpers) nor the bench tools (which bring the charts); see
// docs/architecture.md.
func TestStaysOutOfBinaries(t *testing.T) {
	for _, dep := range testkit.Deps(t, "github.com/meshid/meshid/cmd/meshid", "github.com/meshid/meshid/cmd/meshid-agent") {
		if dep == "github.com/meshid/meshid/testkit" || strings.HasPrefix(dep, "github.com/meshid/meshid/bench/") {
			t.Errorf("a production binary links %s", dep)
		}
	}
}

// TestRoot: Root makes a self-signed CA certificate of its key, a new
// P-256 one when the spec has none.
func TestRoot(t *testing.T) {
	root, key := testkit.Root(t, certs.CASpec{NotBefore: time.Now(), TTL: time.Hour, MaxPathLen: -1})
	if !root.IsCA || root.CheckSignatureFrom(root) != nil || !certs.KeyMatches(root.PublicKey, key) {
		t.Fatalf("root IsCA %v, self-signed %v", root.IsCA, root.CheckSignatureFrom(root))
	}
	if _, ok := key.Public().(*ecdsa.PublicKey); !ok {
		t.Fatalf("key %T, want ECDSA", key.Public())
	}
}

// Plugged's files are a CA the keystore loads as it would an operator's
// cacerts: the intermediate signs, under the root it returns.
func TestPlugged(t *testing.T) {
	files, inter, root := testkit.Plugged(t, "op")
	b, err := keystore.LoadFiles(files, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !b.Cert.Equal(inter) || len(b.Roots) != 1 || !b.Roots[0].Equal(root) {
		t.Fatalf("loaded CA %q under %d roots, want the intermediate %q under the root %q", b.Cert.Subject, len(b.Roots), inter.Subject, root.Subject)
	}
	if inter.Subject.CommonName != "op intermediate" || root.Subject.CommonName != "op root" {
		t.Errorf("names %q, %q", inter.Subject.CommonName, root.Subject.CommonName)
	}
}

// Refuses fails on a valid config refused and on each invalid one accepted.
func TestRefuses(t *testing.T) {
	type config struct{ n int }
	positive := func(c config) (int, error) {
		if c.n <= 0 {
			return 0, errors.New("n must be positive")
		}
		return c.n, nil
	}
	bad := map[string]func(*config){"zero": func(c *config) { c.n = 0 }, "negative": func(c *config) { c.n = -1 }}
	if got := call(t, func(tb testing.TB) { testkit.Refuses(tb, positive, config{1}, bad) }).failures(); got != "" {
		t.Errorf("a validator that refuses both failed: %s", got)
	}
	if got := call(t, func(tb testing.TB) { testkit.Refuses(tb, positive, config{0}, bad) }).failures(); !strings.Contains(got, "valid config is refused") {
		t.Errorf("a refused valid config: %q", got)
	}
	lax := func(c config) (int, error) { return c.n, nil }
	if got := call(t, func(tb testing.TB) { testkit.Refuses(tb, lax, config{1}, bad) }).failures(); got != "negative: an invalid config is accepted\nzero: an invalid config is accepted" {
		t.Errorf("a validator that accepts everything: %q", got)
	}
}
