package logs

import "log/slog"

// OrDiscard returns l, or a logger that discards everything when l is nil.
// Constructors use it to default Config.Logger, as clock.OrReal defaults
// Config.Clock.
func OrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
