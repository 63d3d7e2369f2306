package main

import (
	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// newAgentCmd is `meshid agent`, the same command as the lean meshid-agent
// binary (cmd/meshid-agent), kept in the full CLI as an alias.
func newAgentCmd(run cli.AgentRun) *cobra.Command {
	return cli.AgentCommand("agent", run)
}
