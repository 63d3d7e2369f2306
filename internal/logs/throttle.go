package logs

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Warnings caused by a client (a NACK, an unknown name, a refused request,
// a JWT-SVID request the CA failed) are throttled, so that a client
// repeating a bad request cannot flood the agent's log: WarnBurst lines at
// once, then one per WarnEvery. The lines left out are counted in the next
// one ("suppressed"); callers still count every event in their metrics.
const (
	WarnBurst = 5
	WarnEvery = time.Minute
)

// Throttle is a warning budget: WarnBurst lines, then one per WarnEvery,
// on the time its caller passes (the injected clock). It is safe for
// concurrent use. SDS streams create theirs on their first warning, so a
// well-behaved stream pays nothing.
type Throttle struct {
	mu         sync.Mutex
	lim        *rate.Limiter
	suppressed int
}

// NewThrottle returns a full budget.
func NewThrottle() *Throttle {
	return &Throttle{lim: rate.NewLimiter(rate.Every(WarnEvery), WarnBurst)}
}

// Allow reports whether a warning may be logged at now, and how many were
// left out since the last one allowed.
func (t *Throttle) Allow(now time.Time) (ok bool, suppressed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.lim.AllowN(now, 1) {
		t.suppressed++
		return false, 0
	}
	suppressed, t.suppressed = t.suppressed, 0
	return true, suppressed
}

// Warn logs msg with args on log when the budget allows it at now, with
// "suppressed" set to the lines left out before it, if any.
func (t *Throttle) Warn(log *slog.Logger, now time.Time, msg string, args ...any) {
	if !log.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	ok, suppressed := t.Allow(now)
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	log.Warn(msg, args...)
}
