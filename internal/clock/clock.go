package clock

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer that meshid uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a real timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// OrReal returns c, or Real when c is nil. Constructors use it to default
// Config.Clock.
func OrReal(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Fake is a manually advanced clock. Timers fire when Add or Set moves the
// time past their deadline. It is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced whenever the set of timers changes
}

// NewFake returns a fake clock set to now.
func NewFake(now time.Time) *Fake {
	return &Fake{now: now, changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.deadline = f.now.Add(d)
	if d <= 0 {
		t.c <- f.now
		return t
	}
	f.addLocked(t)
	return t
}

// Add advances the clock by d and fires every timer whose deadline passed.
func (f *Fake) Add(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.fireLocked()
	f.mu.Unlock()
}

// Set moves the clock to t (which may not be earlier than now) and fires
// every timer whose deadline passed.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.now = t
	}
	f.fireLocked()
	f.mu.Unlock()
}

// Waiters returns the number of pending timers.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextDeadline returns the earliest pending timer deadline, if any.
func (f *Fake) NextDeadline() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return time.Time{}, false
	}
	return f.timers[0].deadline, true
}

// Deadlines returns the deadlines of the pending timers, earliest first.
// Tests use it to see when goroutines parked on timers will wake, without
// waking them.
func (f *Fake) Deadlines() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Time, len(f.timers))
	for i, t := range f.timers {
		out[i] = t.deadline
	}
	return out
}

// WaitForWaiters blocks until at least n timers are pending or done is
// closed. It returns false if done was closed first. Tests use it instead of
// sleeping to know that a goroutine has parked on a timer.
func (f *Fake) WaitForWaiters(n int, done <-chan struct{}) bool {
	for {
		f.mu.Lock()
		if len(f.timers) >= n {
			f.mu.Unlock()
			return true
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

// addLocked inserts t after every timer due no later than it, keeping
// f.timers sorted by deadline and timers with equal deadlines in creation
// order; a binary search keeps thousands of timers cheap.
func (f *Fake) addLocked(t *fakeTimer) {
	i := sort.Search(len(f.timers), func(i int) bool { return f.timers[i].deadline.After(t.deadline) })
	f.timers = slices.Insert(f.timers, i, t)
	f.notifyLocked()
}

func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			f.notifyLocked()
			return true
		}
	}
	return false
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *Fake) fireLocked() {
	fired := false
	for len(f.timers) > 0 && !f.timers[0].deadline.After(f.now) {
		t := f.timers[0]
		f.timers = f.timers[1:]
		select {
		case t.c <- f.now:
		default:
		}
		fired = true
	}
	if fired {
		f.notifyLocked()
	}
}

type fakeTimer struct {
	f        *Fake
	c        chan time.Time
	deadline time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.removeLocked(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	active := t.f.removeLocked(t)
	t.deadline = t.f.now.Add(d)
	if d <= 0 {
		select {
		case t.c <- t.f.now:
		default:
		}
		return active
	}
	t.f.addLocked(t)
	return active
}

// Within runs f on its own goroutine and reports whether it returned within
// d of c's time. When it did not, f goes on running: the caller gives up on
// it (a server's Stop held up by handlers it cannot interrupt).
func Within(c Clock, d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	timer := c.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C():
		return false
	}
}

// Loop runs step after first and then again after each wait step returns,
// or sooner when wake receives (a nil wake never does), until ctx ends. It
// is the one periodic loop of meshid's background tasks (a select on ctx
// and one timer of c), so that each task writes only its step. A step
// that sees ctx end may return anything: Loop returns before calling it
// again.
func Loop(ctx context.Context, c Clock, first time.Duration, wake <-chan struct{}, step func(context.Context) time.Duration) {
	t := c.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-wake:
		}
		if ctx.Err() != nil {
			return
		}
		t.Reset(step(ctx))
	}
}
