package testkit

import (
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
)

// WaitForTimers waits until n timers are set on clk (the components under
// test are parked on it), failing t after Guard. what names the timers for
// the failure ("the Manager's renewal timer").
func WaitForTimers(t testing.TB, clk *clock.Fake, n int, what string) {
	t.Helper()
	guard := make(chan struct{})
	timer := time.AfterFunc(Guard, func() { close(guard) })
	defer timer.Stop()
	if !clk.WaitForWaiters(n, guard) {
		t.Fatalf("%s: not set on the clock within %v", what, Guard)
	}
}

// NextDeadline waits until a timer is set on clk (see WaitForTimers) and
// returns the earliest deadline: when the component parked on it wakes.
func NextDeadline(t testing.TB, clk *clock.Fake, what string) time.Time {
	t.Helper()
	WaitForTimers(t, clk, 1, what)
	d, ok := clk.NextDeadline()
	if !ok {
		t.Fatalf("%s: no timer on the clock", what)
	}
	return d
}
