package clock_test

import (
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
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
