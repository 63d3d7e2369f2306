package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

func main() { os.Exit(cli.Execute(newCmd(cli.RunAgent), os.Stderr, cli.ExitCode)) }

// newCmd is the agent command as the binary's root.
func newCmd(run cli.AgentRun) *cobra.Command {
	cmd := cli.AgentCommand("meshid-agent", run)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	cli.SetVersion(cmd)
	cli.MarkUsageErrors(cmd)
	return cmd
}
