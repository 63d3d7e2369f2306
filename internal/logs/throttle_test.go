package logs_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/testkit"
)

// A Throttle lets WarnBurst warnings through, then one per WarnEvery on
// the time it is given; the next line let through counts those left out.
func TestThrottle(t *testing.T) {
	rec := testkit.NewLogRecorder()
	log := rec.Logger()
	th := logs.NewThrottle()
	now := time.Unix(1e9, 0)
	for i := range 100 {
		th.Warn(log, now, "client misbehaves", "i", i)
	}
	if n := rec.Count("client misbehaves"); n != logs.WarnBurst {
		t.Fatalf("%d lines for 100 warnings at once, want %d", n, logs.WarnBurst)
	}
	th.Warn(log, now.Add(logs.WarnEvery-time.Second), "client misbehaves")
	if n := rec.Count("client misbehaves"); n != logs.WarnBurst {
		t.Fatalf("a line before WarnEvery passed: %d", n)
	}
	th.Warn(log, now.Add(logs.WarnEvery), "client misbehaves")
	if rec.Count("client misbehaves") != logs.WarnBurst+1 || rec.CountContaining("suppressed=96") != 1 {
		t.Fatalf("after WarnEvery: want one more line counting 96 left out:\n%s", rec.All())
	}
	// A logger that discards warnings spends no budget.
	quiet := logs.NewThrottle()
	off := slog.New(slog.NewTextHandler(&strings.Builder{}, &slog.HandlerOptions{Level: slog.LevelError}))
	for range 10 {
		quiet.Warn(off, now, "x")
	}
	if ok, suppressed := quiet.Allow(now); !ok || suppressed != 0 {
		t.Fatalf("after warnings a disabled logger dropped: allow %v, suppressed %d", ok, suppressed)
	}
}
