package testkit

import (
	"path/filepath"
	"testing"

	"github.com/meshid/meshid/sds/agent"
)

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
