package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/internal/buildinfo"
)

// SetVersion gives root a --version flag and a version subcommand, both
// printing the binary's build information to stdout.
func SetVersion(root *cobra.Command) {
	v := buildinfo.Get().String()
	root.Version = v
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version and build date",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", cmd.Root().Name(), v)
			return err
		},
	})
}
