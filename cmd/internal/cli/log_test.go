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

// TestNewBufferedLogger: the CA's logger writes through a buffer that
// warnings and Flush empty.
func TestNewBufferedLogger(t *testing.T) {
	var out bytes.Buffer
	l, buf, err := cli.NewBufferedLogger(&out, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("certificate issued")
	l.Warn("review failed")
	if s := out.String(); !strings.Contains(s, "msg=\"certificate issued\"") || !strings.HasSuffix(s, "msg=\"review failed\"\n") {
		t.Fatalf("after a warning: %q", s)
	}
	out.Reset()
	l.Info("last")
	if err := buf.Flush(); err != nil || out.String() == "" {
		t.Fatalf("Flush: %v, %q", err, out.String())
	}
	if _, _, err := cli.NewBufferedLogger(&out, "loud", "text"); err == nil {
		t.Fatal("--log-level loud accepted")
	}
}
