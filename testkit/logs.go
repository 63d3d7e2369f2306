package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogRecorder is a slog.Handler that keeps every record as a line (message,
// then key=value attributes) and lets tests wait for a record instead of
// sleeping.
type LogRecorder struct {
	mu      sync.Mutex
	msgs    []string
	changed chan struct{} // closed and replaced on every record
}

// NewLogRecorder returns an empty LogRecorder.
func NewLogRecorder() *LogRecorder { return &LogRecorder{changed: make(chan struct{})} }

// Logger returns a logger writing to l.
func (l *LogRecorder) Logger() *slog.Logger { return slog.New(l) }

func (l *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *LogRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{l: l, attrs: as}
}
func (l *LogRecorder) WithGroup(string) slog.Handler { return l }
func (l *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	return l.record(r, nil)
}

func (l *LogRecorder) record(r slog.Record, attrs []slog.Attr) error {
	var b strings.Builder
	b.WriteString(r.Message)
	for _, a := range attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	return nil
}

type attrHandler struct {
	l     *LogRecorder
	attrs []slog.Attr
}

func (h *attrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *attrHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{l: h.l, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *attrHandler) WithGroup(string) slog.Handler { return h }
func (h *attrHandler) Handle(_ context.Context, r slog.Record) error {
	return h.l.record(r, h.attrs)
}

// Count returns how many records start with prefix.
func (l *LogRecorder) Count(prefix string) int {
	return l.count(func(m string) bool { return strings.HasPrefix(m, prefix) })
}

// CountContaining returns how many records contain sub, in the message or
// an attribute.
func (l *LogRecorder) CountContaining(sub string) int {
	return l.count(func(m string) bool { return strings.Contains(m, sub) })
}

func (l *LogRecorder) count(match func(string) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if match(m) {
			n++
		}
	}
	return n
}

// All returns every record, one a line.
func (l *LogRecorder) All() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.msgs, "\n")
}

// WaitFor blocks until n records start with prefix, and fails the test
// after Guard.
func (l *LogRecorder) WaitFor(t testing.TB, prefix string, n int) {
	t.Helper()
	l.waitFor(t, prefix, n, l.Count)
}

// WaitForContaining blocks until n records contain sub, and fails the test
// after Guard.
func (l *LogRecorder) WaitForContaining(t testing.TB, sub string, n int) {
	t.Helper()
	l.waitFor(t, sub, n, l.CountContaining)
}

func (l *LogRecorder) waitFor(t testing.TB, what string, n int, count func(string) int) {
	t.Helper()
	timeout := time.After(Guard)
	for {
		l.mu.Lock()
		ch := l.changed
		l.mu.Unlock()
		if count(what) >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("no %d log records %q; got:\n%s", n, what, l.All())
		}
	}
}
