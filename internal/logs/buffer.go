package logs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/meshid/meshid/internal/clock"
)

// Defaults of a Buffer.
const (
	// DefaultMaxDelay is how long a line may wait in a Buffer before it is
	// written: 100 ms. A SIGKILL or a crash loses at most the lines of the
	// last 100 ms (and at most DefaultMaxSize bytes of them).
	DefaultMaxDelay = 100 * time.Millisecond
	// DefaultMaxSize is how many bytes may wait in a Buffer: 64 KiB. A
	// write that fills it writes everything at once.
	DefaultMaxSize = 64 << 10
	// maxMaxDelay bounds BufferConfig.MaxDelay: a log line must not wait
	// longer than this for anyone to see it.
	maxMaxDelay = 10 * time.Second
)

// BufferConfig configures a Buffer.
type BufferConfig struct {
	// Writer receives the buffered lines, several in one Write. Required.
	Writer io.Writer
	// MaxDelay is the longest a line waits before it is written. Default
	// DefaultMaxDelay; at most 10 s.
	MaxDelay time.Duration
	// MaxSize is the most bytes that wait; a write reaching it writes
	// everything at once. Default DefaultMaxSize.
	MaxSize int
	Clock   clock.Clock
}

// Buffer is an io.Writer that gathers log lines and writes them to its
// Writer at most MaxDelay after the first of them, or at once when MaxSize
// bytes wait: the CA's per-certificate audit line cost one write system
// call per certificate (3.5-4.1% of the CA's CPU at 6,000 certificates per
// second); buffered, a few hundred lines share one. Each Write's bytes
// stay together and in order (a slog handler writes one whole line per
// Write), so the output is the same lines as without the Buffer.
//
// The owner calls Flush when it stops; FlushOn flushes after records of
// a level (warnings and errors are written at once, with the lines before
// them).
type Buffer struct {
	w        io.Writer
	maxDelay time.Duration
	maxSize  int
	clock    clock.Clock

	wmu sync.Mutex // held while writing to w: flushes stay in order

	mu    sync.Mutex
	buf   []byte // waiting to be written
	spare []byte // the other buffer, reused after a flush
	armed bool   // a timer will flush within maxDelay
}

// NewBuffer validates cfg and returns a Buffer.
func NewBuffer(cfg BufferConfig) (*Buffer, error) {
	if cfg.Writer == nil {
		return nil, errors.New("logs: BufferConfig.Writer is required")
	}
	if cfg.MaxDelay < 0 || cfg.MaxDelay > maxMaxDelay {
		return nil, fmt.Errorf("logs: buffer delay %s is not within 0 to %s", cfg.MaxDelay, maxMaxDelay)
	}
	if cfg.MaxSize < 0 {
		return nil, fmt.Errorf("logs: negative buffer size %d", cfg.MaxSize)
	}
	return &Buffer{
		w:        cfg.Writer,
		maxDelay: cmp.Or(cfg.MaxDelay, DefaultMaxDelay),
		maxSize:  cmp.Or(cfg.MaxSize, DefaultMaxSize),
		clock:    clock.OrReal(cfg.Clock),
	}, nil
}

// Write keeps p to be written within MaxDelay, or writes everything now
// when MaxSize bytes wait. It reports the error of that write, if any;
// a later flush's error goes to the caller of Flush, or nowhere when a
// timer flushed (a log line has nobody else to report to).
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.buf = append(b.buf, p...)
	full := len(b.buf) >= b.maxSize
	if !full && !b.armed {
		// One timer at a time: only its goroutine disarms it, so Flush
		// calls in between do not start more.
		b.armed = true
		t := b.clock.NewTimer(b.maxDelay)
		go b.flushAfter(t)
	}
	b.mu.Unlock()
	if full {
		return len(p), b.Flush()
	}
	return len(p), nil
}

func (b *Buffer) flushAfter(t clock.Timer) {
	<-t.C()
	b.mu.Lock()
	b.armed = false
	b.mu.Unlock()
	_ = b.Flush()
}

// Flush writes everything waiting, in one Write.
func (b *Buffer) Flush() error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	out := b.buf
	b.buf = b.spare[:0]
	b.mu.Unlock()
	if len(out) == 0 {
		b.spare = out
		return nil
	}
	_, err := b.w.Write(out)
	if cap(out) <= 4*b.maxSize {
		b.spare = out[:0] // reused; a huge one-off line's buffer is not kept
	} else {
		b.spare = nil
	}
	if err != nil {
		return fmt.Errorf("logs: %w", err)
	}
	return nil
}

// Flusher is what FlushOn flushes; a *Buffer is one.
type Flusher interface{ Flush() error }

// FlushOn returns a handler that passes every record to h and flushes f
// after each record at level or above, so that warnings and errors are
// written at once, after the lines logged before them.
func FlushOn(h slog.Handler, f Flusher, level slog.Level) slog.Handler {
	return flushHandler{h: h, f: f, level: level}
}

type flushHandler struct {
	h     slog.Handler
	f     Flusher
	level slog.Level
}

func (fh flushHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return fh.h.Enabled(ctx, l)
}

func (fh flushHandler) Handle(ctx context.Context, r slog.Record) error {
	err := fh.h.Handle(ctx, r)
	if r.Level >= fh.level {
		err = errors.Join(err, fh.f.Flush())
	}
	return err
}

func (fh flushHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return flushHandler{h: fh.h.WithAttrs(as), f: fh.f, level: fh.level}
}

func (fh flushHandler) WithGroup(name string) slog.Handler {
	return flushHandler{h: fh.h.WithGroup(name), f: fh.f, level: fh.level}
}
