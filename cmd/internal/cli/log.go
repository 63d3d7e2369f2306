package cli

import (
	"fmt"
	"io"
	"log/slog"
)

// NewLogger returns a logger to w at level (--log-level: debug, info, warn
// or error) in format (--log-format: text, or json for one JSON object per
// line).
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", format)
}

// LogFormatUsage is the help of --log-format.
const LogFormatUsage = "text | json (one JSON object per line)"
