package testkit

import (
	"context"
	"runtime"
	"testing"
)

// Result is what a function run by Go returned.
type Result[T any] struct {
	Value T
	Err   error
}

// Go runs f in a new goroutine and returns a channel that receives its
// results once, for tests that drive a blocking call (a Run under an
// injected clock) from the test's goroutine.
func Go[T any](f func() (T, error)) <-chan Result[T] {
	done := make(chan Result[T], 1)
	go func() {
		v, err := f()
		done <- Result[T]{v, err}
	}()
	return done
}

// Until spins until cond holds, failing t after Guard: for a test that
// waits for goroutines to reach a state nothing signals. It yields the
// processor between checks and never sleeps.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Guard)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		default:
			runtime.Gosched()
		}
	}
}
