package devstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/sds/agent"
)

// Defaults of Config, and the files the stack writes into its state
// directory beside the CA's and the issuer's.
const (
	DefaultStateDir = "./.meshid-dev"
	TokenFile       = "token"
	SDSSocket       = "sds.sock"
	WorkloadSocket  = "workload.sock"
	// TokenTTL is the lifetime of the default/default token; it is re-minted
	// at half that, as the kubelet refreshes projected tokens.
	TokenTTL = 24 * time.Hour
)

// Config is one `meshid dev`.
type Config struct {
	StateDir              string // DefaultStateDir if empty; created 0700
	Listen                string // the CA's gRPC address; caserver's default if empty
	SDSSocket             string // <StateDir>/sds.sock if empty
	MonitoringListen      string // the CA's /metrics /healthz /readyz; empty disables
	AgentMonitoringListen string // the agent's; empty disables
	Pprof                 bool   // /debug/pprof/ on MonitoringListen
	Logger                *slog.Logger
	Clock                 clock.Clock // mints and re-mints the token
}

// Stack is a `meshid dev`: New builds the CA, Listen binds it and builds
// and binds the agent, Run serves both.
type Stack struct {
	cfg       Config
	log       *slog.Logger
	issuer    *devissuer.Issuer
	tokenFile string
	caCfg     caserver.Config
	ca        *caserver.Server
	agentCfg  agent.Config
	agent     *agent.Agent
}

// New creates the state directory, the issuer's key and JWKS and the
// default/default token (audience istio-ca) in it, and the CA.
func New(cfg Config) (*Stack, error) {
	cfg.StateDir = cmp.Or(cfg.StateDir, DefaultStateDir)
	cfg.SDSSocket = cmp.Or(cfg.SDSSocket, filepath.Join(cfg.StateDir, SDSSocket))
	cfg.Clock = clock.OrReal(cfg.Clock)
	s := &Stack{cfg: cfg, log: logs.OrDiscard(cfg.Logger), tokenFile: filepath.Join(cfg.StateDir, TokenFile)}
	// The CA's address first: in use, it stops the stack before it writes
	// or logs anything.
	if err := caserver.CheckListen(cfg.Listen); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	var err error
	if s.issuer, err = devissuer.LoadOrCreate(cfg.StateDir, devissuer.DefaultIssuer); err != nil {
		return nil, err
	}
	if err := s.writeToken(); err != nil {
		return nil, err
	}
	s.caCfg = caConfig(cfg, s.issuer)
	s.caCfg.Logger = s.log.With(logs.KeyProcess, "ca") // not "component": the CA's parts set their own
	if s.ca, err = caserver.New(s.caCfg); err != nil {
		return nil, err
	}
	return s, nil
}

// caConfig is the CA of meshid dev: caserver's defaults on a self-signed
// root in the state directory, authenticating the issuer's tokens offline.
func caConfig(cfg Config, issuer *devissuer.Issuer) caserver.Config {
	return caserver.Config{
		Listen:   cfg.Listen, // caserver.DefaultListen if empty
		StateDir: cfg.StateDir,
		Authn: caserver.AuthnConfig{
			JWTIssuer: issuer.Issuer(),
			JWKSFile:  filepath.Join(cfg.StateDir, devissuer.JWKSFile),
		},
		Monitoring: caserver.MonitoringConfig{
			Listen: cfg.MonitoringListen,
			Pprof:  cfg.Pprof,
		},
	}
}

// agentConfig is the agent of meshid dev: agent's defaults, talking to the
// CA at caAddr with the default/default token.
func agentConfig(cfg Config, caAddr, tokenFile string) agent.Config {
	return agent.Config{
		CAAddr:           caAddr,
		CARootFile:       filepath.Join(cfg.StateDir, "root-cert.pem"),
		TokenFile:        tokenFile,
		SDSSocket:        cfg.SDSSocket,
		MonitoringListen: cfg.AgentMonitoringListen,
		// The SPIFFE Workload API beside SDS, from the same cache.
		WorkloadAPISocket: filepath.Join(cfg.StateDir, WorkloadSocket),
		// dev serves no file resources: its state dir holds the CA key.
		FileSecretDirs: []string{},
		// POST /debug/rotate for trying rotation, only on loopback.
		DebugEndpoints: monitor.Loopback(cfg.AgentMonitoringListen),
	}
}

// DialAddr is where the built-in agent reaches the CA bound at addr: a CA
// listening on every interface (--listen 0.0.0.0:PORT, as in a container)
// is dialled on 127.0.0.1, which its serving certificate names; "::" is not.
func DialAddr(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
}

// Listen binds the CA, then builds the agent for the CA's bound address
// and binds its sockets: once it returns, Banner shows the real addresses
// (port 0 too) and the sockets accept connections.
func (s *Stack) Listen() error {
	if err := s.ca.Listen(); err != nil {
		return err
	}
	s.agentCfg = agentConfig(s.cfg, DialAddr(s.ca.Addr()), s.tokenFile)
	s.agentCfg.Logger = s.log.With(logs.KeyProcess, "agent")
	var err error
	if s.agent, err = agent.New(s.agentCfg); err != nil {
		return err
	}
	return s.agent.Listen()
}

// Run serves the CA and the agent, and re-mints the token, until ctx ends
// or a component fails. It calls Listen if it was not called.
func (s *Stack) Run(ctx context.Context) error {
	if s.agent == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.ca.Run(ctx) })
	g.Go(func() error { return s.agent.Run(ctx) })
	g.Go(func() error { return s.refreshToken(ctx) })
	return g.Wait()
}

// Banner prints where everything is, after Listen; self is how the binary
// was invoked, so that the suggested command runs as printed.
func (s *Stack) Banner(w io.Writer, self string) {
	fmt.Fprintf(w, `meshid dev is running (Ctrl-C stops it)
  CA (CreateCertificate, TLS)  %s
  CA root                      %s
  JWT issuer JWKS              %s
  token (default/default)      %s
  SDS socket (Envoy)           %s
  Workload API socket (SPIFFE) %s
  CA metrics/health            %s
  agent metrics/health         %s
Try: %s inspect --sds %s
     %s inspect --workload-api %s
`, s.ca.Addr(), s.agentCfg.CARootFile, s.caCfg.Authn.JWKSFile, s.tokenFile, s.agent.SocketPath(), s.agentCfg.WorkloadAPISocket,
		addrOrDisabled(s.ca.MonitoringAddr()), addrOrDisabled(s.agent.MonitoringAddr()), self, s.agent.SocketPath(), self, s.agentCfg.WorkloadAPISocket)
}

// addrOrDisabled prints a listener's address, "(disabled)" for none.
func addrOrDisabled(a net.Addr) string {
	if a == nil {
		return "(disabled)"
	}
	return a.String()
}

func (s *Stack) writeToken() error {
	tok, err := s.issuer.Mint("default", "default", []string{"istio-ca"}, TokenTTL, s.cfg.Clock.Now())
	if err != nil {
		return err
	}
	return certs.WriteFileAtomic(s.tokenFile, []byte(tok), 0o600)
}

// refreshToken re-mints the default token at half its lifetime, like the
// kubelet refreshes projected service-account tokens.
func (s *Stack) refreshToken(ctx context.Context) error {
	t := s.cfg.Clock.NewTimer(TokenTTL / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			if err := s.writeToken(); err != nil {
				s.log.Warn("refresh dev token", logs.KeyError, err)
			}
			t.Reset(TokenTTL / 2)
		}
	}
}

// TokenRequest is a service-account token of the dev issuer (meshid dev
// token): for any identity and audience, unlike the stack's own token.
type TokenRequest struct {
	StateDir string // a meshid dev's state directory, holding its issuer key
	// CreateIssuer creates the issuer (key and jwks.json) in StateDir when
	// there is none, for a `meshid server --jwks-file` started by hand.
	CreateIssuer              bool
	Namespace, ServiceAccount string
	Audience                  string
	TTL                       time.Duration
}

// ErrNoIssuer is returned by Token for a state directory that holds no dev
// issuer: a token minted by a new issuer there would be trusted by no CA.
var ErrNoIssuer = errors.New("no dev issuer")

// Token mints r's token, valid from now, with the issuer of the meshid dev
// whose state directory is r.StateDir. Unless r.CreateIssuer, it writes
// nothing: a directory without an issuer is refused with ErrNoIssuer and
// the command that creates one.
func Token(r TokenRequest, now time.Time) (string, error) {
	dir := cmp.Or(r.StateDir, DefaultStateDir)
	load := devissuer.Load
	if r.CreateIssuer {
		load = devissuer.LoadOrCreate
	}
	issuer, err := load(dir, devissuer.DefaultIssuer)
	if errors.Is(err, devissuer.ErrNoKey) {
		return "", fmt.Errorf("--state-dir %s: %w (%s does not exist): `meshid dev --state-dir %s` creates one and runs the CA that trusts its tokens; "+
			"give the --state-dir of the meshid dev that is running, or add --create-issuer for a meshid server you start with --jwks-file %s",
			dir, ErrNoIssuer, filepath.Join(dir, devissuer.KeyFile), dir, filepath.Join(dir, devissuer.JWKSFile))
	}
	if err != nil {
		return "", err
	}
	return issuer.Mint(r.Namespace, r.ServiceAccount, []string{r.Audience}, r.TTL, now)
}
