package cli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Output formats of the -o/--output flag; each command accepts those that
// apply to what it prints.
const (
	OutputTable = "table" // for a person
	OutputJSON  = "json"  // for scripts
	OutputPEM   = "pem"   // certificates only, as PEM blocks
)

// Output is the value of a command's -o/--output flag: one of the formats
// it was registered with. A value outside them fails the flag's parsing,
// so the command line is refused with ExitUsage before the command runs.
type Output struct {
	value   string
	formats []string
}

// OutputFlag registers -o/--output on fs, accepting formats (the first is
// the default), and returns its value.
func OutputFlag(fs *pflag.FlagSet, formats ...string) *Output {
	o := &Output{value: formats[0], formats: formats}
	fs.VarP(o, "output", "o", "output `format`: "+o.choices())
	return o
}

// String is the format chosen.
func (o *Output) String() string { return o.value }

// Is reports whether the format chosen is f.
func (o *Output) Is(f string) bool { return o.value == f }

// Set accepts one of the registered formats.
func (o *Output) Set(s string) error {
	if !slices.Contains(o.formats, s) {
		// pflag's error quotes the value already: not a second time.
		return fmt.Errorf("unknown output format (want %s)", o.choices())
	}
	o.value = s
	return nil
}

// Type names the value in the help text.
func (o *Output) Type() string { return "format" }

func (o *Output) choices() string {
	switch n := len(o.formats); n {
	case 1:
		return o.formats[0]
	default:
		return strings.Join(o.formats[:n-1], ", ") + " or " + o.formats[n-1]
	}
}
