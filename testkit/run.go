package testkit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Guard bounds every wait of this package, so that a bug fails a test
// instead of hanging it.
const Guard = 30 * time.Second

// Run starts each run (a component's Run method) in its own goroutine and,
// when the test ends, cancels them and checks that each returned nil.
func Run(t testing.TB, what string, runs ...func(context.Context) error) {
	t.Helper()
	t.Cleanup(Start(t, what, runs...))
}

// Start starts each run in its own goroutine. The returned function (safe
// to call more than once) cancels them and checks that each returned nil
// within Guard; what names them in errors.
func Start(t testing.TB, what string, runs ...func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(runs))
	for _, run := range runs {
		go func() { done <- run(ctx) }()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			timeout := time.After(Guard)
			for range runs {
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("%s: Run: %v", what, err)
					}
				case <-timeout:
					t.Errorf("%s: Run did not return", what)
					return
				}
			}
		})
	}
}
