package authn

import (
	"crypto/sha256"
	"time"

	"k8s.io/apimachinery/pkg/util/cache"

	"github.com/meshid/meshid/internal/clock"
)

// maxCacheShards bounds the shards of a tokenCache; minShardSize keeps a
// small cache in one shard, an exact LRU.
const (
	maxCacheShards = 16
	minShardSize   = 256
)

// tokenCache remembers authentication results by the SHA-256 of the token,
// each until its own expiry, evicting the least recently used entry when
// full. Every request of the CA goes through it, and an LRU takes its lock
// exclusively even for a hit (to move the entry to the front), so it is
// split into shards, each an LRU with its own lock, chosen by the first
// byte of the hash: concurrent requests rarely wait for one another. The
// bound and the LRU order hold per shard.
type tokenCache struct {
	shards []*cache.LRUExpireCache
}

func newTokenCache(size int, clk clock.Clock) *tokenCache {
	n := 1
	for n < maxCacheShards && size/(2*n) >= minShardSize {
		n *= 2
	}
	c := &tokenCache{shards: make([]*cache.LRUExpireCache, n)}
	for i := range c.shards {
		c.shards[i] = cache.NewLRUExpireCacheWithClock((size+n-1)/n, clk)
	}
	return c
}

func (c *tokenCache) shard(key [32]byte) *cache.LRUExpireCache {
	return c.shards[int(key[0])%len(c.shards)]
}

func (c *tokenCache) get(key [32]byte) (any, bool) { return c.shard(key).Get(key) }

func (c *tokenCache) add(key [32]byte, v any, ttl time.Duration) { c.shard(key).Add(key, v, ttl) }

// tokenKey is the cache key of a token: its SHA-256. The token is copied
// into a stack buffer rather than converted with []byte(token), which
// allocates a heap copy of the whole token on every request.
func tokenKey(token string) [32]byte {
	var buf [2048]byte // a service-account JWT is about 1 KiB
	if len(token) <= len(buf) {
		return sha256.Sum256(append(buf[:0], token...))
	}
	return sha256.Sum256([]byte(token))
}
