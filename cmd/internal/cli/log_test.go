package cli_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// TestNewLoggerFlushesWarnings: to a logs.Buffer, an info line waits and a
// warning is written at once with it; a plain writer gets every line.
func TestNewLoggerFlushesWarnings(t *testing.T) {
	var out bytes.Buffer
	b, err := logs.NewBuffer(logs.BufferConfig{Writer: &out, Clock: clock.NewFake(time.Unix(1e9, 0))})
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"text", "json"} {
		out.Reset()
		l, err := cli.NewLogger(b, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		l.Info("certificate issued")
		if out.Len() != 0 {
			t.Fatalf("%s: info line written at once: %q", format, out.String())
		}
		l.Warn("review failed")
		if s := out.String(); !strings.Contains(s, "certificate issued") || !strings.Contains(s, "review failed") {
			t.Fatalf("%s: after a warning: %q", format, s)
		}
	}
	out.Reset()
	l, err := cli.NewLogger(&out, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	if l.Info("x"); !strings.Contains(out.String(), "msg=x") {
		t.Fatalf("plain writer: %q", out.String())
	}
	if _, err := cli.NewLogger(&out, "info", "xml"); err == nil {
		t.Fatal("--log-format xml accepted")
	}
}
