package testkit

import (
	"maps"
	"slices"
	"testing"
)

// Refuses checks a constructor's validation, the test every component's
// New has: newFn accepts ok, and refuses ok as each function of bad (named
// by its key) changes it. The copies of ok are shallow.
func Refuses[C, T any](t testing.TB, newFn func(C) (T, error), ok C, bad map[string]func(*C)) {
	t.Helper()
	if _, err := newFn(ok); err != nil {
		t.Fatalf("the valid config is refused: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		cfg := ok
		bad[name](&cfg)
		if _, err := newFn(cfg); err == nil {
			t.Errorf("%s: an invalid config is accepted", name)
		}
	}
}
