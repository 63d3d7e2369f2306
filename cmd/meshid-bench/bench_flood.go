package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/bench/agentflood"
)

func newBenchFloodCmd() *cobra.Command {
	var cfg agentflood.Config
	cmd := &cobra.Command{
		Use:   "agent-flood",
		Short: "Attack an agent's sockets as issue 28 did and measure what it costs the agent and the CA",
		Long: `meshid-bench agent-flood makes --jwt-calls FetchJWTSVID calls with distinct
audiences on the Workload API socket, --jwt-concurrency at a time, each giving up
after --jwt-deadline; then opens --header-streams SDS streams with --header-size
bytes of headers (one connection each) and --streams SDS streams on one connection,
with a raw HTTP/2 client that ignores the server's advertised limits.

It prints the calls and streams by gRPC code, and the agent's RSS (--agent-pid),
goroutines (--goroutines-url, a /debug/pprof/goroutine?debug=1 page) and the CA's
JWT-SVIDs minted (--ca-metrics) before, right after, and --settle after the attack.`,
		Example: `  meshid dev --pprof --monitoring-listen 127.0.0.1:15014 &
  meshid-bench agent-flood --workload-socket .meshid-dev/workload.sock --jwt-calls 20000 \
      --agent-pid $! --goroutines-url 'http://127.0.0.1:15014/debug/pprof/goroutine?debug=1' \
      --ca-metrics http://127.0.0.1:15014/metrics`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := agentflood.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			rep.Format(cmd.OutOrStdout())
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.WorkloadSocket, "workload-socket", "", "the agent's Workload API `socket`")
	fl.IntVar(&cfg.JWTCalls, "jwt-calls", 0, "FetchJWTSVID calls, each with its own audience")
	fl.IntVar(&cfg.JWTConcurrency, "jwt-concurrency", 256, "FetchJWTSVID calls at a time")
	fl.DurationVar(&cfg.JWTDeadline, "jwt-deadline", 20*time.Millisecond, "each FetchJWTSVID call's deadline")
	fl.StringVar(&cfg.SDSSocket, "sds-socket", "", "the agent's SDS `socket`")
	fl.IntVar(&cfg.HeaderStreams, "header-streams", 0, "SDS streams with huge headers, one connection each")
	fl.IntVar(&cfg.HeaderSize, "header-size", 15<<20, "bytes of header of each --header-streams stream")
	fl.IntVar(&cfg.Streams, "streams", 0, "SDS streams on one connection")
	fl.DurationVar(&cfg.Settle, "settle", 10*time.Second, "wait after the attack before the last sample")
	fl.IntVar(&cfg.AgentPID, "agent-pid", 0, "the agent's `pid`, for its RSS")
	fl.StringVar(&cfg.GoroutinesURL, "goroutines-url", "", "a goroutine profile `URL` (…/debug/pprof/goroutine?debug=1) of the agent's process")
	fl.StringVar(&cfg.CAMetricsURL, "ca-metrics", "", "the CA's /metrics `URL` (meshid_ca_jwtsvid_issued_total)")
	return cmd
}
