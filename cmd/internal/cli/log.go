package cli

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/meshid/meshid/internal/logs"
)

// NewLogger returns a logger to w at level (--log-level: debug, info, warn
// or error) in format (--log-format: text, or json for one JSON object per
// line). When w is a logs.Flusher (a *logs.Buffer), warnings and errors
// flush it: they are written at once, after the lines before them.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format: %q is not text or json", format)
	}
	if f, ok := w.(logs.Flusher); ok {
		h = logs.FlushOn(h, f, slog.LevelWarn)
	}
	return slog.New(h), nil
}

// NewBufferedLogger is NewLogger to a logs.Buffer on w (the CA's log: its
// per-certificate audit line would cost a write system call each); the
// caller flushes the buffer when it stops.
func NewBufferedLogger(w io.Writer, level, format string) (*slog.Logger, *logs.Buffer, error) {
	buf, err := logs.NewBuffer(logs.BufferConfig{Writer: w})
	if err != nil {
		return nil, nil, err
	}
	l, err := NewLogger(buf, level, format)
	return l, buf, err
}

// LogFormatUsage is the help of --log-format.
const LogFormatUsage = "text | json (one JSON object per line)"
