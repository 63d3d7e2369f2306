package main

import (
	"os"

	"github.com/meshid/meshid/cmd/internal/cli"
)

func main() { os.Exit(cli.Execute(newRootCmd(os.Stdout, os.Stderr), os.Stderr, cli.ExitCode)) }
