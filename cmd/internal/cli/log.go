package cli

import (
	"fmt"
	"io"
	"log/slog"
)

// NewLogger returns a text logger to w at level (--log-level: debug, info,
// warn or error).
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
