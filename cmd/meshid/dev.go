package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
)

// devIssuerURL is the `iss` of tokens minted by meshid dev.
const devIssuerURL = "https://meshid.dev.local"

// devTokenTTL is the lifetime of the default/default token meshid dev writes;
// it is re-minted at half that, as kubelet refreshes projected tokens.
const devTokenTTL = 24 * time.Hour

type devFlags struct {
	stateDir         string
	listen           string
	sdsSocket        string
	monitoringListen string
	agentMonitoring  string
	logLevel         string
	pprof            bool
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
	fs.StringVar(&f.stateDir, "state-dir", "./.meshid-dev", "directory for the root, the JWT issuer key, jwks.json, the token and the socket")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:15012", "address of the CA's gRPC CSR API")
	fs.StringVar(&f.sdsSocket, "sds-socket", "", "SDS socket (default <state-dir>/sds.sock)")
	fs.StringVar(&f.monitoringListen, "monitoring-listen", "127.0.0.1:15014", "CA /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.agentMonitoring, "agent-monitoring-listen", "127.0.0.1:15020", "agent /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on --monitoring-listen (performance work)")
	cmd.AddCommand(newDevTokenCmd())
	return cmd
}

func runDev(ctx context.Context, f *devFlags, stdout, stderr io.Writer) error {
	logger, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.stateDir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	issuer, err := devissuer.LoadOrCreate(f.stateDir, devIssuerURL)
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(f.stateDir, "token")
	if err := writeDevToken(issuer, tokenFile); err != nil {
		return err
	}
	sf := &serverFlags{
		listen:           f.listen,
		trustDomain:      "cluster.local",
		stateDir:         f.stateDir,
		rootKeyType:      string(certs.ECP256),
		defaultTTL:       24 * time.Hour,
		maxTTL:           2160 * time.Hour,
		tokenAudiences:   []string{"istio-ca"},
		jwtIssuer:        issuer.Issuer(),
		jwksFile:         filepath.Join(f.stateDir, "jwks.json"),
		monitoringListen: f.monitoringListen,
		pprof:            f.pprof,
	}
	caStack, err := buildCA(ctx, sf, nil, prometheus.NewRegistry(), logger.With("component", "ca"))
	if err != nil {
		return err
	}
	if err := caStack.grpc.Listen(); err != nil {
		return err
	}
	sock := f.sdsSocket
	if sock == "" {
		sock = filepath.Join(f.stateDir, "sds.sock")
	}
	af := &agentFlags{
		caAddr:           caStack.grpc.Addr().String(),
		caRoot:           filepath.Join(f.stateDir, "root-cert.pem"),
		tokenFile:        tokenFile,
		sdsSocket:        sock,
		certTTL:          24 * time.Hour,
		graceRatio:       0.5,
		jitter:           0.01,
		keyType:          string(certs.ECP256),
		monitoringListen: f.agentMonitoring,
		trustDomain:      "cluster.local",
	}
	agent, err := buildAgent(af, prometheus.NewRegistry(), logger.With("component", "agent"))
	if err != nil {
		return err
	}

	// Bind everything before the banner: it then shows the bound addresses
	// (with port 0 too), and the socket accepts connections once printed.
	caMon, agentMon := "(disabled)", "(disabled)"
	if caStack.monitor != nil {
		if err := caStack.monitor.Listen(); err != nil {
			return err
		}
		caMon = caStack.monitor.Addr().String()
	}
	if agent.monitor != nil {
		if err := agent.monitor.Listen(); err != nil {
			return err
		}
		agentMon = agent.monitor.Addr().String()
	}
	if err := agent.sds.Listen(); err != nil {
		return err
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return caStack.run(ctx) })
	g.Go(func() error { return agent.run(ctx) })
	g.Go(func() error { return refreshDevToken(ctx, issuer, tokenFile, logger) })

	fmt.Fprintf(stdout, `meshid dev is running (Ctrl-C stops it)
  CA (CreateCertificate, TLS)  %s
  CA root                      %s
  JWT issuer JWKS              %s
  token (default/default)      %s
  SDS socket (Envoy)           %s
  CA metrics/health            %s
  agent metrics/health         %s
Try: meshid inspect --sds %s
`, caStack.grpc.Addr(), af.caRoot, sf.jwksFile, tokenFile, sock,
		caMon, agentMon, sock)
	return g.Wait()
}

func writeDevToken(issuer *devissuer.Issuer, path string) error {
	tok, err := issuer.Mint("default", "default", []string{"istio-ca"}, devTokenTTL, time.Now())
	if err != nil {
		return err
	}
	return certs.WriteFileAtomic(path, []byte(tok), 0o600)
}

// refreshDevToken re-mints the default token at half its lifetime, like the
// kubelet refreshes projected service-account tokens.
func refreshDevToken(ctx context.Context, issuer *devissuer.Issuer, path string, logger interface {
	Warn(string, ...any)
}) error {
	t := time.NewTicker(devTokenTTL / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := writeDevToken(issuer, path); err != nil {
				logger.Warn("refresh dev token", "err", err)
			}
		}
	}
}

func newDevTokenCmd() *cobra.Command {
	var (
		stateDir, ns, sa, audience string
		ttl                        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Print a service-account JWT signed by the dev issuer",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			issuer, err := devissuer.LoadOrCreate(stateDir, devIssuerURL)
			if err != nil {
				return err
			}
			tok, err := issuer.Mint(ns, sa, []string{audience}, ttl, time.Now())
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&stateDir, "state-dir", "./.meshid-dev", "the dev state directory (holds the issuer key)")
	fs.StringVar(&ns, "namespace", "default", "namespace of the identity")
	fs.StringVar(&sa, "service-account", "default", "service account of the identity")
	fs.StringVar(&audience, "audience", "istio-ca", "token audience")
	fs.DurationVar(&ttl, "ttl", time.Hour, "token lifetime")
	return cmd
}
