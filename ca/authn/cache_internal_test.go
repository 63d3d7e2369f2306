package authn

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
)

func TestTokenCacheShards(t *testing.T) {
	for _, tc := range []struct{ size, shards int }{{1, 1}, {2, 1}, {511, 1}, {512, 2}, {1000, 2}, {4096, 16}, {10000, 16}, {1 << 20, 16}} {
		c := newTokenCache(tc.size, clock.NewFake(time.Unix(0, 0)))
		if len(c.shards) != tc.shards {
			t.Errorf("size %d: %d shards, want %d", tc.size, len(c.shards), tc.shards)
		}
	}
	// A full cache holds about its size: every shard is bounded.
	clk := clock.NewFake(time.Unix(0, 0))
	c := newTokenCache(4096, clk)
	for i := range 20000 {
		c.add(sha256.Sum256(fmt.Appendf(nil, "token-%d", i)), i, time.Minute)
	}
	held := 0
	for _, s := range c.shards {
		held += len(s.Keys())
	}
	if held > 4096 || held < 4096*9/10 {
		t.Errorf("cache of 4096 holds %d entries after 20000 adds", held)
	}
	k := sha256.Sum256([]byte("token-19999"))
	if v, ok := c.get(k); !ok || v != 19999 {
		t.Errorf("last added entry: %v %v", v, ok)
	}
	clk.Add(time.Minute + time.Second)
	if _, ok := c.get(k); ok {
		t.Error("entry served after its TTL")
	}
}

func TestTokenKey(t *testing.T) {
	for _, n := range []int{0, 1, 700, 2047, 2048, 2049, 10000} {
		tok := string(make([]byte, n))
		if got, want := tokenKey(tok), sha256.Sum256([]byte(tok)); got != want {
			t.Errorf("%d-byte token: key %x, want its SHA-256 %x", n, got, want)
		}
	}
	tok := string(make([]byte, 1200))
	if allocs := testing.AllocsPerRun(100, func() { _ = tokenKey(tok) }); allocs != 0 {
		t.Errorf("tokenKey of a 1200-byte token allocates %v times", allocs)
	}
}
