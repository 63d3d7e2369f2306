package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/bench/sdsload"
	"github.com/meshid/meshid/cmd/internal/cli"
)

type benchSDSFlags struct {
	socket, agentAdmin     string
	output                 *cli.Output
	resources              []string
	streams, perConn, open int
	slowest                int
	agentPID               int
	rotate, quiet, holdGC  bool
	timeout                time.Duration
}

func newBenchSDSCmd() *cobra.Command {
	f := &benchSDSFlags{}
	cmd := &cobra.Command{
		Use:   "sds",
		Short: "Open many SDS streams against an agent and time default, ROOTCA and a rotation",
		Long: `meshid-bench sds opens --streams SDS streams (StreamSecrets, as Envoy does) on the
agent's socket, --streams-per-conn per gRPC connection, each subscribing to
default and ROOTCA and acknowledging every response.

It reports the time until each stream holds both (p50/p90/p99/max), the agent's
RSS before and after the streams opened when --agent-pid is given, and with
--rotate the time from a forced rotation (POST http://<agent-admin>/debug/rotate)
until every stream holds a new default certificate.`,
		Example: `  meshid-bench sds --sds-socket .meshid-dev/sds.sock --streams 1000
  meshid-bench sds --sds-socket ./var/run/secrets/workload-spiffe-uds/socket --streams 10000 \
      --agent-pid $(pgrep -f 'meshid agent') --rotate --agent-admin 127.0.0.1:15020
  meshid-bench sds --sds-socket .meshid-dev/sds.sock --streams 2000 --open-concurrency 1   # one new stream at a time, warm cache`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchSDS(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.socket, "sds-socket", "./var/run/secrets/workload-spiffe-uds/socket", "the agent's SDS Unix `socket`")
	fl.IntVar(&f.streams, "streams", 1000, "number of SDS streams")
	fl.IntVar(&f.perConn, "streams-per-conn", sdsload.DefaultStreamsPerConn, "streams per gRPC connection")
	fl.IntVar(&f.open, "open-concurrency", 0, "streams opening at once (0: all together; 1: one at a time)")
	fl.StringSliceVar(&f.resources, "resource", nil, "resource `name` each stream subscribes to (repeatable; default: default,ROOTCA)")
	fl.IntVar(&f.agentPID, "agent-pid", 0, "the agent's `pid`, to report its RSS (0: not measured)")
	fl.BoolVar(&f.rotate, "rotate", false, "force a rotation once every stream is ready and time its fan-out")
	fl.StringVar(&f.agentAdmin, "agent-admin", "127.0.0.1:15020", "the agent's monitoring `address`, serving POST "+sdsload.RotatePath)
	fl.DurationVar(&f.timeout, "timeout", sdsload.DefaultTimeout, "bound on the wait for the streams, and again for the rotation")
	fl.IntVar(&f.slowest, "slowest", 5, "list this many slowest streams with where their time went (open, request, first response, rest)")
	fl.BoolVar(&f.holdGC, "hold-gc", true, "keep this tool's garbage collector off while it measures (1 GiB soft memory limit): its collections would count as agent latency")
	f.output = cli.OutputFlag(fl, cli.OutputTable, cli.OutputJSON)
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress lines on standard error")
	return cmd
}

func runBenchSDS(cmd *cobra.Command, f *benchSDSFlags) error {
	if f.agentPID == os.Getpid() {
		f.agentPID = 0 // the agent is in this process: its RSS includes the load
	}
	stderr := cmd.ErrOrStderr()
	cfg := sdsload.Config{
		Socket: f.socket, Streams: f.streams, StreamsPerConn: f.perConn, OpenConcurrency: f.open,
		Resources: f.resources, PID: f.agentPID, Timeout: f.timeout, HoldGC: f.holdGC, Slowest: f.slowest,
	}
	if f.rotate {
		cfg.Rotate = sdsload.HTTPRotate(nil, f.agentAdmin)
	}
	if !f.quiet {
		cfg.Progress = func(p sdsload.Progress) {
			if p.Phase == sdsload.PhaseRotate {
				fmt.Fprintf(stderr, "bench sds: rotation  %5.1fs  %d/%d streams rotated  %d failed\n", p.Elapsed.Seconds(), p.Rotated, p.Streams, p.Failed)
				return
			}
			fmt.Fprintf(stderr, "bench sds: opening  %5.1fs  %d/%d streams ready  %d failed\n", p.Elapsed.Seconds(), p.Ready, p.Streams, p.Failed)
		}
	}
	l, err := sdsload.New(cfg)
	if err != nil {
		return fmt.Errorf("bench sds: %w", err)
	}
	rep, runErr := l.Run(cmd.Context())
	if rep == nil {
		return fmt.Errorf("bench sds: %w", runErr)
	}
	out := cmd.OutOrStdout()
	if f.output.Is(cli.OutputJSON) {
		err = writeJSON(out, rep)
	} else {
		err = rep.WriteTable(out)
	}
	if err != nil {
		return err
	}
	if runErr != nil {
		return fmt.Errorf("bench sds: %w", runErr)
	}
	if rep.Failed > 0 {
		return fmt.Errorf("bench sds: %d of %d streams failed", rep.Failed, rep.Streams)
	}
	return nil
}
