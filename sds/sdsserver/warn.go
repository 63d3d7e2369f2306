package sdsserver

import "github.com/meshid/meshid/internal/logs"

// Warnings caused by a client (NACKs, unknown names, other types, refused
// requests) are throttled per stream with logs.Throttle (logs.WarnBurst
// lines at once, then one per logs.WarnEvery, the lines left out counted in
// the next one); FetchSecrets calls share one budget. Every event is still
// counted in the metrics.

// warnLocked logs a warning about the stream's client, within its budget.
func (s *stream) warnLocked(msg string, args ...any) {
	if s.warns == nil {
		s.warns = logs.NewThrottle()
	}
	s.warns.Warn(s.srv.log, s.srv.clock.Now(), msg, s.logAttrs(args...)...)
}

// fetchWarn logs a warning about a FetchSecrets call, within the budget
// FetchSecrets calls share.
func (s *Server) fetchWarn(msg string, args ...any) {
	s.fetchWarns.Warn(s.log, s.clock.Now(), msg, append([]any{"api", "fetch"}, args...)...)
}
