package main

import (
	"context"
	"io"
	"testing"
	"time"

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
	cmd = newCmd(func(context.Context, agent.Config) error { return nil })
	cmd.SetArgs([]string{"extra"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("an argument was accepted")
	}
}
