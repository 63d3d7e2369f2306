package cli_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// TestExecute: a failing command prints its name and error and returns the
// code of its error (1 by default); a command that succeeds returns 0 and
// prints nothing; the command runs with a live context.
func TestExecute(t *testing.T) {
	boom := errors.New("boom")
	newCmd := func(err error) *cobra.Command {
		return &cobra.Command{Use: "tool [flags]", SilenceErrors: true, SilenceUsage: true, RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Context() == nil || cmd.Context().Err() != nil {
				return errors.New("no live context")
			}
			return err
		}}
	}
	for _, tc := range []struct {
		name     string
		err      error
		code     func(error) int
		want     int
		wantText string
	}{
		{"success", nil, nil, 0, ""},
		{"failure", boom, nil, 1, "tool: boom\n"},
		{"own code", boom, func(err error) int { return map[bool]int{true: 3}[errors.Is(err, boom)] }, 3, "tool: boom\n"},
	} {
		var stderr bytes.Buffer
		cmd := newCmd(tc.err)
		cmd.SetArgs(nil)
		if got := cli.Execute(cmd, &stderr, tc.code); got != tc.want || stderr.String() != tc.wantText {
			t.Errorf("%s: Execute = %d, stderr %q; want %d, %q", tc.name, got, stderr.String(), tc.want, tc.wantText)
		}
	}
}
