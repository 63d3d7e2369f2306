package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/cmd/internal/cli"
)

// rotationFlags are the CA rotation flags of `meshid server` (docs/rotation.md).
type rotationFlags struct {
	propagation time.Duration
	threshold   time.Duration
	adminSocket string
}

func (f *rotationFlags) register(fs *pflag.FlagSet) {
	fs.DurationVar(&f.propagation, "rotation-propagation", rotation.DefaultPropagation, "time a new CA with new roots is trusted before it signs (2x the agents' 5m root refresh)")
	fs.DurationVar(&f.threshold, "root-rotation-threshold", rotation.DefaultRootRotationThreshold, "prepare a new self-signed root when less than this is left of the current one (negative = never)")
	fs.StringVar(&f.adminSocket, "admin-socket", "", "Unix socket (mode 0600) of the local admin API: meshid certs activate | rotate-root | status (empty = off)")
}

func (f *rotationFlags) apply(cfg *caserver.Config) {
	cfg.Rotation.Propagation, cfg.Rotation.RootThreshold, cfg.AdminSocket = f.propagation, f.threshold, f.adminSocket
}

// newRotationCmds are `meshid certs activate`, `rotate-root` and `status`:
// thin clients of a running server's admin socket.
func newRotationCmds() []*cobra.Command {
	type call func(*admin.Client, context.Context) (admin.Status, error)
	mk := func(use, short string, c call) *cobra.Command {
		var socket string
		var output *cli.Output
		cmd := &cobra.Command{
			Use: use, Short: short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				st, err := c(admin.NewClient(socket, 30*time.Second), cmd.Context())
				if err != nil {
					return err
				}
				return st.Print(cmd.OutOrStdout(), time.Now(), output.Is(cli.OutputJSON))
			},
		}
		cmd.Flags().StringVar(&socket, "admin-socket", "", "the server's --admin-socket")
		output = cli.OutputFlag(cmd.Flags(), cli.OutputTable, cli.OutputJSON)
		_ = cmd.MarkFlagRequired("admin-socket")
		return cmd
	}
	return []*cobra.Command{
		mk("activate", "Make the prepared CA sign now, before --rotation-propagation has passed", (*admin.Client).Activate),
		mk("rotate-root", "Prepare a new self-signed root (the old one keeps signing until activation)", (*admin.Client).RotateRoot),
		mk("status", "Print the CA rotation: phase, signing CA, trust bundle with expiries, next step", (*admin.Client).Status),
	}
}
