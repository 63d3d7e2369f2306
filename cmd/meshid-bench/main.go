package main

import (
	"os"

	"github.com/meshid/meshid/cmd/internal/cli"
)

func main() { os.Exit(cli.Execute(newBenchCmd(), os.Stderr, cli.ExitCode)) }
