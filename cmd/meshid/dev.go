package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/devstack"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
)

// devFlags are the flags of `meshid dev`: the stack's Config and the log.
type devFlags struct {
	cfg                 devstack.Config
	logLevel, logFormat string
}

func newDevCmd() *cobra.Command {
	f := &devFlags{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the CA and the agent in one process, with no cluster: the embedded default",
		Long: `meshid dev runs the CA on a self-signed root, an offline JWT issuer standing in
for Kubernetes, and the agent serving SDS, all in one process. It writes
root-cert.pem, jwks.json and token (for default/default, audience istio-ca)
into --state-dir and serves until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.cfg.StateDir, "state-dir", devstack.DefaultStateDir, "directory for the root, the JWT issuer key, jwks.json, the token and the socket")
	fs.StringVar(&f.cfg.Listen, "listen", caserver.DefaultListen, "address of the CA's gRPC CSR API")
	fs.StringVar(&f.cfg.SDSSocket, "sds-socket", "", "SDS socket (default <state-dir>/sds.sock)")
	fs.StringVar(&f.cfg.MonitoringListen, "monitoring-listen", caserver.DefaultMonitoringListen, "CA /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.cfg.AgentMonitoringListen, "agent-monitoring-listen", agent.DefaultMonitoringListen, "agent /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.StringVar(&f.logFormat, "log-format", "text", cli.LogFormatUsage)
	fs.BoolVar(&f.cfg.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on --monitoring-listen (performance work)")
	cmd.AddCommand(newDevTokenCmd())
	return cmd
}

func runDev(ctx context.Context, f *devFlags, stdout, stderr io.Writer) error {
	cfg := f.cfg
	logger, logOut, err := cli.NewBufferedLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	defer logOut.Flush()
	cfg.Logger = logger
	dev, err := devstack.New(cfg)
	if err != nil {
		return err
	}
	// Bind everything before the banner: it then shows the bound addresses
	// (with port 0 too), and the socket accepts connections once printed.
	if err := dev.Listen(); err != nil {
		return err
	}
	dev.Banner(stdout, self())
	return dev.Run(ctx)
}

// self is how this binary was invoked (bin/meshid under make run, meshid
// from the PATH), so that the banner's commands run as printed.
func self() string {
	if len(os.Args) == 0 || os.Args[0] == "" {
		return "meshid"
	}
	return os.Args[0]
}

func newDevTokenCmd() *cobra.Command {
	var r devstack.TokenRequest
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Print a service-account JWT signed by the dev issuer",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tok, err := devstack.Token(r, time.Now())
			if errors.Is(err, devstack.ErrNoIssuer) {
				return cli.Usage(err) // --state-dir names no meshid dev: a wrong command line
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&r.StateDir, "state-dir", devstack.DefaultStateDir, "the state directory of a meshid dev (holds its issuer key; run meshid dev first)")
	fs.BoolVar(&r.CreateIssuer, "create-issuer", false, "create the issuer (jwt-key.pem, jwks.json) in --state-dir if it has none, for a meshid server started with --jwt-issuer "+devissuer.DefaultIssuer+" --jwks-file <state-dir>/jwks.json")
	fs.StringVar(&r.Namespace, "namespace", "default", "namespace of the identity")
	fs.StringVar(&r.ServiceAccount, "service-account", "default", "service account of the identity")
	fs.StringVar(&r.Audience, "audience", "istio-ca", "token audience")
	fs.DurationVar(&r.TTL, "ttl", time.Hour, "token lifetime")
	return cmd
}
