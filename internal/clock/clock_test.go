package clock_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

func TestFakeTimers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		after   time.Duration
		advance time.Duration
		fired   bool
	}{
		{"before deadline", time.Minute, 59 * time.Second, false},
		{"at deadline", time.Minute, time.Minute, true},
		{"past deadline", time.Minute, time.Hour, true},
		{"zero duration fires at once", 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := clock.NewFake(t0)
			tm := f.NewTimer(tc.after)
			f.Add(tc.advance)
			select {
			case got := <-tm.C():
				if !tc.fired {
					t.Fatalf("timer fired at %v, want not fired", got)
				}
			default:
				if tc.fired {
					t.Fatal("timer did not fire")
				}
			}
		})
	}
}

func TestFakeStopResetWaiters(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	if got := f.Waiters(); got != 1 {
		t.Fatalf("Waiters = %d, want 1", got)
	}
	if !tm.Stop() {
		t.Fatal("Stop of pending timer returned false")
	}
	f.Add(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("stopped timer fired")
	default:
	}
	tm.Reset(time.Second)
	done := make(chan struct{})
	if !f.WaitForWaiters(1, done) {
		t.Fatal("WaitForWaiters returned false")
	}
	f.Add(time.Second)
	<-tm.C()
	if d, ok := f.NextDeadline(); ok {
		t.Fatalf("unexpected pending deadline %v", d)
	}
}

func TestFakeManyTimersInDeadlineOrder(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	const n = 10000
	timers := make([]clock.Timer, n)
	for i := range timers {
		timers[i] = f.NewTimer(time.Duration((i*7919)%n+1) * time.Millisecond) // every deadline 1ms..10s once, shuffled
	}
	if ds := f.Deadlines(); len(ds) != n || ds[0] != time.Unix(0, 0).Add(time.Millisecond) || ds[n-1] != time.Unix(0, 0).Add(n*time.Millisecond) {
		t.Fatalf("Deadlines: %d, first %v, last %v", len(ds), ds[0], ds[len(ds)-1])
	}
	for want := time.Millisecond; want <= n*time.Millisecond; want += time.Millisecond {
		d, ok := f.NextDeadline()
		if !ok || d != time.Unix(0, 0).Add(want) {
			t.Fatalf("next deadline %v %v, want %v", d, ok, time.Unix(0, 0).Add(want))
		}
		f.Set(d)
		if got := f.Waiters(); got != n-int(want/time.Millisecond) {
			t.Fatalf("at %v: %d waiters", want, got)
		}
	}
	for i, tm := range timers {
		select {
		case <-tm.C():
		default:
			t.Fatalf("timer %d did not fire", i)
		}
	}
}

// Within reports true when f returns before the deadline and false when the
// deadline (on the given clock) comes first, without waiting for f.
func TestWithin(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	if !clock.Within(f, time.Second, func() {}) {
		t.Fatal("a function that returns at once did not return within 1s")
	}
	release := make(chan struct{})
	defer close(release)
	res := make(chan bool, 1)
	go func() { res <- clock.Within(f, time.Second, func() { <-release }) }()
	f.WaitForWaiters(1, nil)
	f.Add(time.Second - time.Nanosecond)
	select {
	case <-res:
		t.Fatal("Within gave up before its deadline")
	default:
	}
	f.Add(time.Nanosecond)
	if <-res {
		t.Fatal("Within reported a blocked function as returned")
	}
}

// Loop steps first after the first wait, then after each wait its step
// returns, at once on a wake, and never again once ctx ends.
func TestLoop(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	steps := make(chan time.Time)
	wake := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		clock.Loop(ctx, f, time.Second, wake, func(context.Context) time.Duration {
			steps <- f.Now()
			return 3 * time.Second
		})
	}()
	step := func(want time.Duration) {
		t.Helper()
		select {
		case at := <-steps:
			if got := at.Sub(time.Unix(0, 0)); got != want {
				t.Fatalf("step at %v, want %v", got, want)
			}
		case <-time.After(testkit.Guard):
			t.Fatalf("no step within %v, want one at %v", testkit.Guard, want)
		}
	}
	notYet := func() {
		t.Helper()
		select {
		case at := <-steps:
			t.Fatalf("early step at %v", at.Sub(time.Unix(0, 0)))
		default:
		}
	}
	f.WaitForWaiters(1, nil)
	f.Add(time.Second - time.Nanosecond)
	notYet()
	f.Add(time.Nanosecond)
	step(time.Second)
	f.WaitForWaiters(1, nil)
	f.Add(3*time.Second - time.Nanosecond)
	notYet()
	select {
	case wake <- struct{}{}: // a wake steps at once and waits the step's time again
	case <-time.After(testkit.Guard):
		t.Fatal("Loop did not take the wake")
	}
	step(4*time.Second - time.Nanosecond)
	giveUp := time.Now().Add(testkit.Guard)
	for d, _ := f.NextDeadline(); !d.Equal(time.Unix(7, -1)); d, _ = f.NextDeadline() {
		if time.Now().After(giveUp) {
			t.Fatalf("timer at %v after the woken step, want 7s-1ns", d.Sub(time.Unix(0, 0)))
		}
		runtime.Gosched() // until Loop re-arms its timer after the step
	}
	f.Add(3 * time.Second)
	step(7*time.Second - time.Nanosecond)
	f.WaitForWaiters(1, nil)
	cancel()
	<-done
	f.Add(time.Hour)
	notYet()
	if n := f.Waiters(); n != 0 {
		t.Errorf("%d timers left after Loop returned", n)
	}
}
