package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newBenchCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "meshid-bench:", err)
		os.Exit(1)
	}
}
