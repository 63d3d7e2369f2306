package reachability_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/reachability"
)

var errDown = errors.New("connection refused")

// scripted is a probe whose answer the test sets.
type scripted struct {
	err   atomic.Pointer[error]
	calls atomic.Int64
}

func (s *scripted) set(err error) { s.err.Store(&err) }

func (s *scripted) probe(context.Context) error {
	s.calls.Add(1)
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// run starts a Tracker on a fake clock and returns it with a step
// function: advance the clock by the interval and wait for the probe it
// causes to be recorded (Run parks on its next timer after recording).
func run(t *testing.T, p *scripted, cfg reachability.Config) (*reachability.Tracker, *clock.Fake, func()) {
	t.Helper()
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	cfg.Name, cfg.Probe, cfg.Clock = "the API server", p.probe, fake
	tr, err := reachability.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tr.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !fake.WaitForWaiters(1, done) {
		t.Fatal("Run returned before its first wait")
	}
	interval := cmpOr(cfg.Interval, reachability.DefaultInterval)
	step := func() {
		t.Helper()
		fake.Add(interval)
		if !fake.WaitForWaiters(1, done) {
			t.Fatal("Run returned")
		}
	}
	return tr, fake, step
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// TestNotReadyUntilFirstAnswer: a replica started while the dependency is
// down is not ready, however long it waits, and is ready at the first
// answer.
func TestNotReadyUntilFirstAnswer(t *testing.T) {
	p := &scripted{}
	p.set(errDown)
	tr, _, step := run(t, p, reachability.Config{})
	for i := range 20 { // 100 s: far past the grace
		if err := tr.Ready(); err == nil || !strings.Contains(err.Error(), "not answered since the start") || !errors.Is(err, errDown) {
			t.Fatalf("probe %d: Ready() = %v, want not answered since the start", i, err)
		}
		if tr.Reachable() {
			t.Fatal("Reachable after a failed probe")
		}
		step()
	}
	p.set(nil)
	step()
	if err := tr.Ready(); err != nil || !tr.Reachable() {
		t.Fatalf("after an answer: Ready() = %v, Reachable %v", err, tr.Reachable())
	}
}

// TestBlipDoesNotFlap: failures shorter than the grace keep it ready; it
// turns not ready once the last answer is Grace old, and ready again at
// the next answer.
func TestBlipDoesNotFlap(t *testing.T) {
	p := &scripted{}
	tr, _, step := run(t, p, reachability.Config{Interval: time.Second, Grace: 10 * time.Second})
	if err := tr.Ready(); err != nil {
		t.Fatalf("Ready() = %v after the first answer", err)
	}
	p.set(errDown)
	for i := 1; i < 10; i++ { // 9 s without an answer
		step()
		if err := tr.Ready(); err != nil {
			t.Fatalf("%d s into the outage: Ready() = %v, want ready within the grace", i, err)
		}
		if tr.Reachable() {
			t.Fatal("Reachable while probes fail")
		}
	}
	step() // 10 s: the grace
	err := tr.Ready()
	if err == nil || !strings.Contains(err.Error(), "not answered for 10s") || !errors.Is(err, errDown) {
		t.Fatalf("at the grace: Ready() = %v, want not answered for 10s", err)
	}
	p.set(nil)
	step()
	if err := tr.Ready(); err != nil {
		t.Fatalf("after it answered again: Ready() = %v", err)
	}
	// A second outage is timed from the new answer, not the first one.
	p.set(errDown)
	step()
	if err := tr.Ready(); err != nil {
		t.Fatalf("1 s into a second outage: Ready() = %v", err)
	}
}

// TestNotReadyBeforeFirstProbe: Ready before any probe completed says so.
func TestNotReadyBeforeFirstProbe(t *testing.T) {
	tr, err := reachability.New(reachability.Config{Name: "the API server", Probe: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Ready(); err == nil || !strings.Contains(err.Error(), "first answer") {
		t.Fatalf("Ready() = %v before any probe", err)
	}
	if tr.Grace() != reachability.DefaultGrace {
		t.Fatalf("Grace() = %v, want the default %v", tr.Grace(), reachability.DefaultGrace)
	}
}

// TestProbeTimeout: a probe that never answers is cut at Timeout and
// counts as a failure.
func TestProbeTimeout(t *testing.T) {
	hung := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	tr, err := reachability.New(reachability.Config{Name: "the API server", Probe: hung, Timeout: 20 * time.Millisecond, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tr.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if !fake.WaitForWaiters(1, done) {
		t.Fatal("Run returned")
	}
	if err := tr.Ready(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ready() = %v, want the probe's deadline", err)
	}
}

// TestStopIsNoVerdict: a probe cut short by Run's end records nothing.
func TestStopIsNoVerdict(t *testing.T) {
	started := make(chan struct{})
	tr, err := reachability.New(reachability.Config{Name: "the API server", Probe: func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tr.Run(ctx) }()
	<-started
	cancel()
	<-done
	if err := tr.Ready(); err == nil || !strings.Contains(err.Error(), "first answer") {
		t.Fatalf("Ready() = %v, want still waiting for the first answer", err)
	}
}

func TestNewRefuses(t *testing.T) {
	probe := func(context.Context) error { return nil }
	for _, cfg := range []reachability.Config{
		{Probe: probe},
		{Name: "x"},
		{Name: "x", Probe: probe, Grace: -time.Second},
		{Name: "x", Probe: probe, Interval: -time.Second},
		{Name: "x", Probe: probe, Timeout: -time.Second},
	} {
		if _, err := reachability.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
