package main

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// newBenchCmd is the hidden `meshid bench`: the load tool is a binary of
// its own (it links the charts, which meshid must not), and a user who
// types `meshid bench` is told where it is instead of the root help.
func newBenchCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "bench",
		Hidden:             true,
		DisableFlagParsing: true, // --help too reaches RunE
		RunE: func(*cobra.Command, []string) error {
			return cli.Usage(errors.New("the load tool is the binary meshid-bench, not a meshid command: `make bench-binary`, then `bin/meshid-bench ca|sds --help` (docs/benchmarks.md)"))
		},
	}
}
