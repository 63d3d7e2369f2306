package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Execute runs the root command cmd of a binary (the body of its main) with
// a context that ends at SIGINT or SIGTERM. When cmd fails it prints
// "<name>: <error>" to stderr and returns code(err) (1 when code is nil);
// else 0. main passes the result to os.Exit.
func Execute(cmd *cobra.Command, stderr io.Writer, code func(error) int) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, cmd.Name()+":", err)
	if code == nil {
		return 1
	}
	return code(err)
}
