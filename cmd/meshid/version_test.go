package main

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/sds/agent"
)

// run executes `meshid args...` with runners that log one line through the
// Config's logger, and returns stdout, stderr and the error.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmdWith(&out, &errb, runners{
		server: func(_ context.Context, cfg caserver.Config) error {
			cfg.Logger.With("component", "x").Info("hello", "k", "v")
			return nil
		},
		agent: func(_ context.Context, cfg agent.Config) error {
			cfg.Logger.Info("hello", "k", "v")
			return nil
		},
	})
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errb.String(), err
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, _, err := run(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out, "meshid ") || !strings.Contains(out, runtime.Version()) || !strings.Contains(out, "commit ") {
			t.Fatalf("%v: %q", args, out)
		}
	}
	if _, _, err := run(t, "version", "extra"); err == nil {
		t.Fatal("version took an argument")
	}
}

// TestLogFormatJSON: every line of --log-format json is one JSON object
// with each key once.
func TestLogFormatJSON(t *testing.T) {
	clearServerEnv(t)
	for _, cmd := range []string{"server", "agent"} {
		_, stderr, err := run(t, cmd, "--log-format", "json")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if len(lines) != 1 {
			t.Fatalf("%s: %q", cmd, stderr)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
			t.Fatalf("%s: %q: %v", cmd, lines[0], err)
		}
		if m["msg"] != "hello" || m["k"] != "v" || m["level"] != "INFO" {
			t.Fatalf("%s: %v", cmd, m)
		}
		_, text, err := run(t, cmd)
		if err != nil || !strings.Contains(text, "msg=hello") || !strings.Contains(text, "k=v") {
			t.Fatalf("%s default text: %q %v", cmd, text, err)
		}
	}
}

func TestLogFormatRefused(t *testing.T) {
	clearServerEnv(t)
	for _, cmd := range []string{"server", "agent", "dev"} {
		_, _, err := run(t, cmd, "--log-format", "xml", "--state-dir", t.TempDir())
		if cmd == "agent" {
			_, _, err = run(t, cmd, "--log-format", "xml")
		}
		if err == nil || !strings.Contains(err.Error(), "--log-format") {
			t.Fatalf("%s: err = %v", cmd, err)
		}
	}
}
