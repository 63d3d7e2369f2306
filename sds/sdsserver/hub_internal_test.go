package sdsserver

import (
	"sync"
	"testing"
)

// TestHubRefCountsConcurrently: subscriptions that come and go on the same
// names from many goroutines at once (streams opening while others close)
// keep a name cached exactly while one is held, and leave nothing behind.
// Run with -race: ref and unref take the map's write lock only to add or
// drop a name.
func TestHubRefCountsConcurrently(t *testing.T) {
	h := newHub(nil)
	h.ref("held") // one subscription that stays throughout
	const goroutines, rounds = 64, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				name := []string{"held", "default"}[(g+i)%2]
				h.ref(name)
				if h.lookup(name) == nil {
					t.Errorf("%s is not cached while a subscription holds it", name)
					return
				}
				h.unref(name)
			}
		}()
	}
	wg.Wait()
	if c := h.lookup("held"); c == nil || c.refs.Load() != 1 {
		t.Fatalf("held: %v, want cached with one reference", c)
	}
	if n := h.size(); n != 1 {
		t.Fatalf("%d names cached, want only the held one", n)
	}
	h.unref("held")
	if n := h.size(); n != 0 {
		t.Fatalf("%d names cached after the last unref, want 0", n)
	}
}
