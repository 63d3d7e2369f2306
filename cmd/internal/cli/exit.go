package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// Exit statuses shared by meshid and meshid-agent (README.md, "Exit status").
const (
	ExitError = 1 // the command ran and failed: unreadable input, a CA that cannot be reached...
	ExitUsage = 2 // the command line is wrong: unknown command or flag, missing or malformed value
)

// ExitCodeError carries a process exit status through cobra.
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }

// Usage marks err as a usage error (exit status 2).
func Usage(err error) error { return &ExitCodeError{Code: ExitUsage, Err: err} }

// ExitCode is the process exit status for err returned by Execute: its
// ExitCodeError's code, else 1.
func ExitCode(err error) int {
	if e := (*ExitCodeError)(nil); errors.As(err, &e) {
		return e.Code
	}
	return ExitError
}

// MarkUsageErrors makes every usage error cobra detects in root's tree
// exit 2: flag parse errors, unexpected arguments, missing required flags
// and (for a root with subcommands) an unknown command. Call it once the
// tree is built.
func MarkUsageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Usage(err) })
	if root.HasSubCommands() && root.Run == nil && root.RunE == nil {
		// cobra's own unknown-command error comes from Find, before any
		// hook: make the root runnable so that it is ours.
		root.Args = cobra.ArbitraryArgs
		root.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) != 0 {
				msg += "; did you mean " + strings.Join(s, ", ") + "?"
			}
			return Usage(errors.New(msg))
		}
	}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					return Usage(err)
				}
				return nil
			}
		}
		// Required flags are checked after the pre-run hooks: check them
		// here first, so that a missing one is a usage error.
		pre := c.PreRunE
		c.PreRunE = func(cmd *cobra.Command, a []string) error {
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return Usage(err)
			}
			if err := cmd.ValidateFlagGroups(); err != nil {
				return Usage(err)
			}
			if pre != nil {
				return pre(cmd, a)
			}
			return nil
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
