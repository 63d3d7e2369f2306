package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// runners run the long-lived commands from their Configs; tests replace
// them to check the Config that flags and environment produce.
type runners struct {
	server serverRun
	agent  cli.AgentRun
}

// newRootCmd builds the command tree. Commands write to the given stdout and
// stderr so that tests can read them.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	return newRootCmdWith(stdout, stderr, runners{server: runServer, agent: cli.RunAgent})
}

// newRootCmdWith is newRootCmd with the given runners.
func newRootCmdWith(stdout, stderr io.Writer, r runners) *cobra.Command {
	root := &cobra.Command{
		Use:           "meshid",
		Short:         "meshid: short-lived X.509 SPIFFE identities for a service mesh",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Subcommands are added here, one constructor per file.
	root.AddCommand(newServerCmd(r.server))
	// `meshid agent` is the lean meshid-agent binary's command
	// (cmd/meshid-agent), kept in the full CLI as an alias.
	root.AddCommand(cli.AgentCommand("agent", r.agent))
	root.AddCommand(newDevCmd())
	root.AddCommand(newInspectCmd())
	root.AddCommand(newCertsCmd())
	root.AddCommand(newGendocsCmd(root), newBenchCmd())
	cli.SetVersion(root)
	cli.MarkUsageErrors(root)
	return root
}
