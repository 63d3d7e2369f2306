package testkit

import (
	"path/filepath"
	"testing"

	"github.com/meshid/meshid/sds"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
)

// Agent runs the agent's parts, m and an SDS server over it, until the test
// ends, and returns the server's socket path (in a ShortDir). cfg is the
// server's configuration; Agent sets its Source and SocketPath.
func Agent(t testing.TB, m *secretcache.Manager, cfg sds.Config) (socket string) {
	t.Helper()
	cfg.Source = m
	cfg.SocketPath = filepath.Join(ShortDir(t), "sds.sock")
	srv, err := sds.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	Run(t, "agent", m.Run, srv.Run)
	return srv.SocketPath()
}

// RunAgent runs the agent assembly (sds/agent, what `meshid agent` runs)
// with cfg until the test ends, its socket and monitoring bound before it
// returns. Unset in cfg: SDSSocket is in a ShortDir; MonitoringListen
// stays as given (empty: no monitoring).
func RunAgent(t testing.TB, cfg agent.Config) *agent.Agent {
	t.Helper()
	if cfg.SDSSocket == "" {
		cfg.SDSSocket = filepath.Join(ShortDir(t), "sds.sock")
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	Run(t, "agent", a.Run)
	return a
}
