package certservice

import (
	"testing"
	"time"
)

// TestPruneForgetsOnlyFullBuckets: prune bounds the limiters' memory by
// forgetting the buckets that have refilled (a caller that comes back gets
// the full bucket it would have had anyway) and keeps every other one, so
// a caller cannot reset its bucket by waiting for a prune. Through the
// server, TestRateLimitAcrossPrunes checks the kept buckets; how many are
// held is seen only here.
func TestPruneForgetsOnlyFullBuckets(t *testing.T) {
	l := newLimiters(1, 2) // 1 token a second, 2 at most
	t0 := time.Now()
	for _, k := range []string{"a", "b"} {
		if !l.allow(k, t0) {
			t.Fatalf("%s: first request refused", k)
		}
	}
	if !l.allow("b", t0) || l.allow("b", t0) {
		t.Fatal("b: a burst of 2 not allowed, or a third request allowed")
	}
	// At t0+1s a has refilled to 2 (full), b holds 1.
	l.prune(t0.Add(time.Second))
	if n := l.len(); n != 1 {
		t.Fatalf("after the first prune %d buckets are held, want 1 (b's)", n)
	}
	if l.allow("b", t0.Add(time.Second)) && l.allow("b", t0.Add(time.Second)) {
		t.Fatal("b's bucket was reset by the prune: two requests allowed with one token")
	}
	// Both are full 2 s later: nothing is held.
	l.prune(t0.Add(3 * time.Second))
	if n := l.len(); n != 0 {
		t.Fatalf("after every bucket refilled %d are held, want 0", n)
	}
}
