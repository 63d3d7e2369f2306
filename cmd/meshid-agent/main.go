package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newCmd(cli.RunAgent).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "meshid-agent:", err)
		os.Exit(cli.ExitCode(err))
	}
}

// newCmd is the agent command as the binary's root.
func newCmd(run cli.AgentRun) *cobra.Command {
	cmd := cli.AgentCommand("meshid-agent", run)
	cmd.SilenceUsage = true
	cmd.SilenceErrors = true
	cli.SetVersion(cmd)
	cli.MarkUsageErrors(cmd)
	return cmd
}
