// Command gen writes docs/reference/metrics.md from the module's source:
// run `go run ./internal/metricsref/gen` at the module's root.
package main

import (
	"fmt"
	"os"

	"github.com/meshid/meshid/internal/metricsref"
)

func main() {
	if err := metricsref.Write("."); err != nil {
		fmt.Fprintln(os.Stderr, "metricsref:", err)
		os.Exit(1)
	}
}
