package logs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/testkit"
)

// writes records every Write call to the underlying writer, as one chunk.
type writes struct {
	mu     sync.Mutex
	chunks []string
	wrote  chan string // every chunk, when not nil
	err    error
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.chunks = append(w.chunks, string(p))
	w.mu.Unlock()
	if w.wrote != nil {
		w.wrote <- string(p)
	}
	return len(p), w.err
}

func (w *writes) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.chunks...)
}

func newBuffer(t *testing.T, cfg logs.BufferConfig) *logs.Buffer {
	t.Helper()
	b, err := logs.NewBuffer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, w io.Writer, s string) {
	t.Helper()
	if _, err := io.WriteString(w, s); err != nil {
		t.Fatal(err)
	}
}

// TestBufferWritesWithinMaxDelay: lines wait until MaxDelay after the first
// of them, not a nanosecond less, and then go out together in one write;
// a thousand lines arm one timer.
func TestBufferWritesWithinMaxDelay(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	out := &writes{wrote: make(chan string, 1)}
	b := newBuffer(t, logs.BufferConfig{Writer: out, Clock: clk})
	write(t, b, "one\n")
	clk.Add(logs.DefaultMaxDelay / 2)
	write(t, b, "two\n")
	for i := range 1000 {
		write(t, b, fmt.Sprintf("line %d\n", i))
	}
	if n := clk.Waiters(); n != 1 {
		t.Fatalf("%d timers armed, want 1", n)
	}
	clk.Add(logs.DefaultMaxDelay/2 - time.Nanosecond)
	if got := out.got(); len(got) != 0 {
		t.Fatalf("written before the delay: %q", got)
	}
	clk.Add(time.Nanosecond)
	select {
	case got := <-out.wrote:
		if !strings.HasPrefix(got, "one\ntwo\nline 0\n") || !strings.HasSuffix(got, "line 999\n") || strings.Count(got, "\n") != 1002 {
			t.Fatalf("one write of every line in order, got %d lines: %.60q...", strings.Count(got, "\n"), got)
		}
	case <-time.After(testkit.Guard):
		t.Fatal("nothing written after the delay")
	}
	// The next line arms a new timer.
	write(t, b, "three\n")
	testkit.WaitForTimers(t, clk, 1, "the buffer's flush timer")
	clk.Add(logs.DefaultMaxDelay)
	select {
	case got := <-out.wrote:
		if got != "three\n" {
			t.Fatalf("second write %q", got)
		}
	case <-time.After(testkit.Guard):
		t.Fatal("the second line was never written")
	}
}

// TestBufferWritesWhenFull: the write that reaches MaxSize writes
// everything before it returns, whatever the clock says.
func TestBufferWritesWhenFull(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	out := &writes{}
	b := newBuffer(t, logs.BufferConfig{Writer: out, Clock: clk, MaxSize: 10})
	write(t, b, "12345\n")
	if got := out.got(); len(got) != 0 {
		t.Fatalf("written below the size: %q", got)
	}
	write(t, b, "6789\n")
	if got := out.got(); len(got) != 1 || got[0] != "12345\n6789\n" {
		t.Fatalf("got %q, want one write of both lines", got)
	}
	// A line larger than the buffer goes out whole, at once.
	huge := strings.Repeat("x", 1<<20) + "\n"
	write(t, b, huge)
	if got := out.got(); len(got) != 2 || got[1] != huge {
		t.Fatalf("a 1 MiB line: %d writes", len(got))
	}
}

// TestBufferFlush: Flush (the owner's, at shutdown) writes what waits, at
// once, and nothing when nothing waits; the writer's error is returned.
func TestBufferFlush(t *testing.T) {
	out := &writes{}
	b := newBuffer(t, logs.BufferConfig{Writer: out, Clock: clock.NewFake(time.Unix(1e9, 0))})
	if err := b.Flush(); err != nil || len(out.got()) != 0 {
		t.Fatalf("empty flush: %v, %q", err, out.got())
	}
	write(t, b, "a\n")
	write(t, b, "b\n")
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := out.got(); len(got) != 1 || got[0] != "a\nb\n" {
		t.Fatalf("got %q", got)
	}
	out.err = errors.New("disk full")
	write(t, b, "c\n")
	if err := b.Flush(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("flush error %v, want the writer's", err)
	}
}

// TestFlushOnWarnings: an info line waits; a warning is written at once,
// after the lines logged before it, and so is an error of a derived
// logger (With, WithGroup).
func TestFlushOnWarnings(t *testing.T) {
	out := &writes{}
	b := newBuffer(t, logs.BufferConfig{Writer: out, Clock: clock.NewFake(time.Unix(1e9, 0))})
	l := slog.New(logs.FlushOn(slog.NewTextHandler(b, nil), b, slog.LevelWarn))
	l.Info("certificate issued", "serial", "1")
	if got := out.got(); len(got) != 0 {
		t.Fatalf("an info line was written at once: %q", got)
	}
	l.Warn("review failed")
	got := out.got()
	if len(got) != 1 || !strings.Contains(got[0], "certificate issued") || !strings.HasSuffix(got[0], "msg=\"review failed\"\n") {
		t.Fatalf("got %q, want the info line, then the warning, in one write", got)
	}
	l.With("component", "ca").WithGroup("g").Error("broken", "k", "v")
	if got := out.got(); len(got) != 2 || !strings.Contains(got[1], "component=ca") || !strings.Contains(got[1], "g.k=v") {
		t.Fatalf("error of a derived logger: %q", got)
	}
	if l.Enabled(t.Context(), slog.LevelDebug) {
		t.Fatal("FlushOn enables what its handler does not")
	}
}

// TestBufferConcurrentLines: lines written at once by many goroutines are
// each written whole, once.
func TestBufferConcurrentLines(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	b := newBuffer(t, logs.BufferConfig{Writer: lockedWriter{&mu, &out}, MaxSize: 4096})
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 200 {
				fmt.Fprintf(b, "goroutine %d line %d %s\n", g, i, strings.Repeat("x", i))
			}
		})
	}
	wg.Wait()
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var g, i int
		var xs string
		if _, err := fmt.Sscanf(line, "goroutine %d line %d %s", &g, &i, &xs); (err != nil && i > 0) || len(xs) != i || seen[line] {
			t.Fatalf("torn or repeated line %.80q", line)
		}
		seen[line] = true
	}
	if len(seen) != 50*200 {
		t.Fatalf("%d lines, want %d", len(seen), 50*200)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestBufferConfigErrors(t *testing.T) {
	for name, cfg := range map[string]logs.BufferConfig{
		"no writer":           {},
		"negative delay":      {Writer: io.Discard, MaxDelay: -time.Second},
		"delay over 10s":      {Writer: io.Discard, MaxDelay: 11 * time.Second},
		"negative size limit": {Writer: io.Discard, MaxSize: -1},
	} {
		if _, err := logs.NewBuffer(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := logs.NewBuffer(logs.BufferConfig{Writer: io.Discard, MaxDelay: 10 * time.Second}); err != nil {
		t.Errorf("10s delay refused: %v", err)
	}
}
