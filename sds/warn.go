package sds

import (
	"time"

	"golang.org/x/time/rate"
)

// Warnings caused by a client (NACKs, unknown names, other types, refused
// requests) are rate-limited per stream, so that a client repeating a bad
// request cannot flood the agent's log: warnBurst lines at once, then one
// per warnEvery. The lines left out are counted in the next one
// ("suppressed") and every event is still counted in the metrics.
const (
	warnBurst = 5
	warnEvery = time.Minute
)

// warnLimiter is a stream's (or FetchSecrets') warning budget. Streams
// create theirs on the first warning: a well-behaved stream pays nothing.
type warnLimiter struct {
	lim        *rate.Limiter
	suppressed int
}

func newWarnLimiter() *warnLimiter {
	return &warnLimiter{lim: rate.NewLimiter(rate.Every(warnEvery), warnBurst)}
}

// allow reports whether a warning may be logged now, and how many were
// suppressed since the last one logged.
func (w *warnLimiter) allow(now time.Time) (ok bool, suppressed int) {
	if !w.lim.AllowN(now, 1) {
		w.suppressed++
		return false, 0
	}
	suppressed, w.suppressed = w.suppressed, 0
	return true, suppressed
}

// warnLocked logs a warning about the stream's client, within its budget.
func (s *stream) warnLocked(msg string, args ...any) {
	if s.warns == nil {
		s.warns = newWarnLimiter()
	}
	ok, suppressed := s.warns.allow(s.srv.clock.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	s.srv.log.Warn(msg, s.logAttrs(args...)...)
}

// fetchWarn logs a warning about a FetchSecrets call, within the budget
// FetchSecrets calls share.
func (s *Server) fetchWarn(msg string, args ...any) {
	s.fetchWarnMu.Lock()
	ok, suppressed := s.fetchWarns.allow(s.clock.Now())
	s.fetchWarnMu.Unlock()
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	s.log.Warn(msg, append([]any{"api", "fetch"}, args...)...)
}
