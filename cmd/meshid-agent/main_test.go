package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/sds/agent"
)

// TestFlagsAndEnv: the binary's command takes the agent's flags and
// istio-agent environment (the full table is in cmd/internal/cli).
func TestFlagsAndEnv(t *testing.T) {
	t.Setenv("CA_ADDR", "istiod:15012")
	t.Setenv("SECRET_TTL", "3600")
	var got agent.Config
	cmd := newCmd(func(_ context.Context, cfg agent.Config) error { got = cfg; return nil })
	cmd.SetArgs([]string{"--grace-ratio", "0.4", "--monitoring-listen", ""})
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got.CAAddr != "istiod:15012" || got.CertTTL != time.Hour || got.GraceRatio != 0.4 || got.MonitoringListen != "" {
		t.Fatalf("Config: %+v", got)
	}
	// A wrong command line exits 2 (usage), as in meshid.
	for _, args := range [][]string{{"extra"}, {"--nope"}, {"--cert-ttl", "x"}} {
		cmd = newCmd(func(context.Context, agent.Config) error { return nil })
		cmd.SetArgs(args)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); cli.ExitCode(err) != cli.ExitUsage {
			t.Fatalf("%v: %v, exit %d; want a usage error", args, err, cli.ExitCode(err))
		}
	}
}

func TestVersionAndLogFormat(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out bytes.Buffer
		cmd := newCmd(func(context.Context, agent.Config) error { return nil })
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		if s := out.String(); !strings.HasPrefix(s, "meshid-agent ") || !strings.Contains(s, runtime.Version()) {
			t.Fatalf("%v: %q", args, s)
		}
	}
	var errb bytes.Buffer
	cmd := newCmd(func(_ context.Context, cfg agent.Config) error { cfg.Logger.Info("hello"); return nil })
	cmd.SetArgs([]string{"--log-format", "json"})
	cmd.SetErr(&errb)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(errb.Bytes(), &m); err != nil || m["msg"] != "hello" {
		t.Fatalf("%q: %v", errb.String(), err)
	}
	cmd.SetArgs([]string{"--log-format", "yaml"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("--log-format yaml accepted")
	}
}
