package logs_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/meshid/meshid/internal/logs"
)

func TestOrDiscard(t *testing.T) {
	if l := logs.OrDiscard(nil); l == nil || l.Enabled(context.Background(), slog.LevelError) {
		t.Fatalf("OrDiscard(nil) = %v, want a logger with nothing enabled", l)
	}
	var buf bytes.Buffer
	own := slog.New(slog.NewTextHandler(&buf, nil))
	if logs.OrDiscard(own) != own {
		t.Fatal("OrDiscard(l) is not l")
	}
}
