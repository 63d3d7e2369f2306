package certservice

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters holds one token bucket per caller identity.
type limiters struct {
	limit rate.Limit
	burst int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newLimiters(perSecond float64, burst int) *limiters {
	return &limiters{limit: rate.Limit(perSecond), burst: burst, m: map[string]*rate.Limiter{}}
}

// allow takes one token from key's bucket at now.
func (l *limiters) allow(key string, now time.Time) bool {
	l.mu.Lock()
	lim, ok := l.m[key]
	if !ok {
		lim = rate.NewLimiter(l.limit, l.burst)
		l.m[key] = lim
	}
	l.mu.Unlock()
	return lim.AllowN(now, 1)
}

// prune forgets buckets that have refilled: a caller that comes back gets
// the same full bucket it would have had, so this only bounds memory.
func (l *limiters) prune(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, lim := range l.m {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.m, k)
		}
	}
}

func (l *limiters) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
