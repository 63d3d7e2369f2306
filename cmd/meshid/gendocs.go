package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// CLIReferenceDir is where the CLI reference is checked in; TestCLIReference
// fails when it differs from what gendocs writes.
const CLIReferenceDir = "docs/reference/cli"

// newGendocsCmd is the hidden `meshid gendocs DIR`: the CLI reference, one
// Markdown page per command, from the command tree itself (cobra's doc
// package), so that it cannot drift from the flags.
func newGendocsCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "gendocs DIR",
		Short:  "Write the CLI reference (Markdown, one page per command) into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := writeCLIReference(root, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CLI reference written to %s\n", args[0])
			return nil
		},
	}
}

// writeCLIReference writes root's reference into dir (created if needed),
// without the date cobra would stamp, so that it is reproducible.
func writeCLIReference(root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root.DisableAutoGenTag = true
	return doc.GenMarkdownTree(root, dir)
}
