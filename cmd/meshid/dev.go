package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/sds/agent"
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
	logFormat        string
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
	fs.StringVar(&f.listen, "listen", caserver.DefaultListen, "address of the CA's gRPC CSR API")
	fs.StringVar(&f.sdsSocket, "sds-socket", "", "SDS socket (default <state-dir>/sds.sock)")
	fs.StringVar(&f.monitoringListen, "monitoring-listen", caserver.DefaultMonitoringListen, "CA /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.agentMonitoring, "agent-monitoring-listen", agent.DefaultMonitoringListen, "agent /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.StringVar(&f.logFormat, "log-format", "text", cli.LogFormatUsage)
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on --monitoring-listen (performance work)")
	cmd.AddCommand(newDevTokenCmd())
	return cmd
}

// devCAConfig is the CA of meshid dev: caserver's defaults on a
// self-signed root in the state directory, authenticating the dev issuer's
// tokens offline.
func devCAConfig(f *devFlags, issuer *devissuer.Issuer) caserver.Config {
	return caserver.Config{
		Listen:           f.listen,
		StateDir:         f.stateDir,
		JWTIssuer:        issuer.Issuer(),
		JWKSFile:         filepath.Join(f.stateDir, devissuer.JWKSFile),
		MonitoringListen: f.monitoringListen,
		Pprof:            f.pprof,
	}
}

// devAgentConfig is the agent of meshid dev: agent's defaults, talking to
// the CA at caAddr with the default/default token.
//
// dialAddr is where the built-in agent reaches the CA bound at addr: a CA
// listening on every interface (--listen 0.0.0.0:PORT, as in a container)
// is dialled on 127.0.0.1, which its serving certificate names; "::" is not.
func dialAddr(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
}

func devAgentConfig(f *devFlags, caAddr, tokenFile string) agent.Config {
	sock := f.sdsSocket
	if sock == "" {
		sock = filepath.Join(f.stateDir, "sds.sock")
	}
	return agent.Config{
		CAAddr:           caAddr,
		CARootFile:       filepath.Join(f.stateDir, "root-cert.pem"),
		TokenFile:        tokenFile,
		SDSSocket:        sock,
		MonitoringListen: f.agentMonitoring,
		// The SPIFFE Workload API beside SDS, from the same cache.
		WorkloadAPISocket: filepath.Join(f.stateDir, "workload.sock"),
		// dev serves no file resources: its state dir holds the CA key.
		FileSecretDirs: []string{},
		// POST /debug/rotate for trying rotation, only on loopback.
		DebugEndpoints: monitor.Loopback(f.agentMonitoring),
	}
}

func runDev(ctx context.Context, f *devFlags, stdout, stderr io.Writer) error {
	logger, err := cli.NewLogger(stderr, f.logLevel, f.logFormat)
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
	caCfg := devCAConfig(f, issuer)
	caCfg.Logger = logger.With("process", "ca") // not "component": the CA's parts set their own
	ca, err := caserver.New(caCfg)
	if err != nil {
		return err
	}
	// Bind everything before the banner: it then shows the bound addresses
	// (with port 0 too), and the socket accepts connections once printed.
	if err := ca.Listen(); err != nil {
		return err
	}
	agentCfg := devAgentConfig(f, dialAddr(ca.Addr()), tokenFile)
	agentCfg.Logger = logger.With("process", "agent")
	ag, err := agent.New(agentCfg)
	if err != nil {
		return err
	}
	if err := ag.Listen(); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ca.Run(ctx) })
	g.Go(func() error { return ag.Run(ctx) })
	g.Go(func() error { return refreshDevToken(ctx, issuer, tokenFile, logger) })
	fmt.Fprintf(stdout, `meshid dev is running (Ctrl-C stops it)
  CA (CreateCertificate, TLS)  %s
  CA root                      %s
  JWT issuer JWKS              %s
  token (default/default)      %s
  SDS socket (Envoy)           %s
  CA metrics/health            %s
  agent metrics/health         %s
Try: %s inspect --sds %s
`, ca.Addr(), agentCfg.CARootFile, caCfg.JWKSFile, tokenFile, ag.SocketPath(),
		addrOrDisabled(ca.MonitoringAddr()), addrOrDisabled(ag.MonitoringAddr()), self(), ag.SocketPath())
	return g.Wait()
}

// self is how this binary was invoked (bin/meshid under make run, meshid
// from the PATH), so that the banner's commands run as printed.
func self() string {
	if len(os.Args) == 0 || os.Args[0] == "" {
		return "meshid"
	}
	return os.Args[0]
}

// addrOrDisabled prints a listener's address, "(disabled)" for none.
func addrOrDisabled(a net.Addr) string {
	if a == nil {
		return "(disabled)"
	}
	return a.String()
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
