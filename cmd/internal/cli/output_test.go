package cli_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// One -o flag for every command: its default is the first format, a
// format the command does not print is a usage error (exit 2), and the
// help names the choices.
func TestOutputFlag(t *testing.T) {
	run := func(args ...string) (string, error) {
		var got string
		cmd := &cobra.Command{Use: "x", SilenceErrors: true, SilenceUsage: true}
		o := cli.OutputFlag(cmd.Flags(), cli.OutputTable, cli.OutputJSON, cli.OutputPEM)
		cmd.RunE = func(*cobra.Command, []string) error { got = o.String(); return nil }
		cli.MarkUsageErrors(cmd)
		var help bytes.Buffer
		cmd.SetOut(&help)
		cmd.SetArgs(args)
		err := cmd.Execute()
		if got == "" {
			got = help.String()
		}
		return got, err
	}
	if got, err := run(); err != nil || got != "table" {
		t.Fatalf("default: %q, %v", got, err)
	}
	if got, err := run("-o", "pem"); err != nil || got != "pem" {
		t.Fatalf("-o pem: %q, %v", got, err)
	}
	if got, err := run("--output=json"); err != nil || got != "json" {
		t.Fatalf("--output=json: %q, %v", got, err)
	}
	for _, bad := range []string{"yaml", "", "JSON", "table,json", strings.Repeat("j", 1<<16)} {
		_, err := run("-o", bad)
		if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), "want table, json or pem") {
			t.Errorf("-o %.20q: exit %d, %v; want a usage error naming the choices", bad, cli.ExitCode(err), err)
		}
		if err != nil && len(err.Error()) > len(bad)+200 {
			// the value is quoted once, not repeated
			t.Errorf("-o %.20q: error of %d bytes", bad, len(err.Error()))
		}
	}
	help, _ := run("--help")
	if !strings.Contains(help, `-o, --output format   output format: table, json or pem (default table)`) {
		t.Errorf("help:\n%s", help)
	}
}
