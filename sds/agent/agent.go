package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"

	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/buildinfo"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/rootfile"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/secretdump"
	"github.com/meshid/meshid/sds/workloadendpoint"
)

// Agent is an assembled node agent.
type Agent struct {
	log     *slog.Logger
	client  *caclient.Client // nil with Config.Signer
	cache   *secretcache.Manager
	sds     *sdsserver.Server
	monitor *monitor.Server          // nil when disabled
	wlapi   *workloadendpoint.Server // nil unless Config.WorkloadAPISocket
}

// New validates cfg, applies its defaults and builds the agent. It binds
// nothing: Listen or Run does.
func New(cfg Config) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg, err = cfg.withMetrics(); err != nil {
		return nil, err
	}
	if err := buildinfo.Register(cfg.Registerer); err != nil {
		return nil, err
	}
	id, err := workloadID(cfg)
	if err != nil {
		return nil, err
	}
	signer, client := cfg.Signer, (*caclient.Client)(nil)
	if signer == nil {
		if client, err = newClient(cfg); err != nil {
			return nil, err
		}
		signer = client
	}
	a, err := assemble(cfg, signer, id)
	if err != nil {
		if client != nil {
			client.Close()
		}
		return nil, err
	}
	a.client = client
	return a, nil
}

// newClient is the CA client of cfg.
func newClient(cfg Config) (*caclient.Client, error) {
	roots := cfg.CARoots
	if len(roots) == 0 {
		if cfg.CARootFile == "" {
			return nil, errors.New("--ca-root is required: the agent only talks to a CA it can verify")
		}
		var err error
		if roots, err = rootfile.Read(cfg.CARootFile, cfg.MaxCARoots); err != nil {
			return nil, fmt.Errorf("--ca-root: %w", err)
		}
	} else if err := rootfile.Check(roots, cfg.MaxCARoots); err != nil {
		return nil, fmt.Errorf("agent: Config.CARoots: %w", err)
	}
	return caclient.New(caclient.Config{
		Addr:       cfg.CAAddr,
		Roots:      roots,
		TokenFile:  cfg.TokenFile,
		ClusterID:  cfg.ClusterID,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	})
}

// assemble builds the SecretManager, the SDS server and monitoring on
// signer.
func assemble(cfg Config, signer secretcache.Signer, id spiffeid.ID) (*Agent, error) {
	mcfg, err := cfg.ManagerConfig(signer, id)
	if err != nil {
		return nil, err
	}
	cache, err := secretcache.New(mcfg)
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(0o600)
	if cfg.SocketGroup {
		mode = 0o660
	}
	srv, err := sdsserver.New(sdsserver.Config{
		Source:     cache,
		SocketPath: cfg.SDSSocket,
		SocketMode: mode,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	a := &Agent{log: cfg.Logger, cache: cache, sds: srv}
	if cfg.WorkloadAPISocket != "" {
		// The SPIFFE Workload API: the second consumer of the same cache,
		// so the proxy and the application hold one identity, rotated
		// together.
		a.wlapi, err = workloadendpoint.New(workloadendpoint.Config{
			Source:     cache,
			SocketPath: cfg.WorkloadAPISocket,
			SocketMode: mode,
			Clock:      cfg.Clock,
			Logger:     cfg.Logger,
			Registerer: cfg.Registerer,
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.MonitoringListen != "" {
		var debug map[string]http.Handler
		if cfg.DebugEndpoints {
			debug = map[string]http.Handler{"/debug/rotate": a.RotateHandler()}
		}
		// Read-only and key-free, so on unless turned off, to loopback
		// peers only (SECURITY.md).
		dump := secretdump.Handler(a.Dump)
		if cfg.DisableDebugSecrets {
			dump = secretdump.Off()
		}
		a.monitor, err = monitor.New(monitor.Config{
			Listen:        cfg.MonitoringListen,
			Gatherer:      cfg.Gatherer,
			Ready:         cache.Ready,
			Logger:        cfg.Logger,
			Handlers:      debug,
			LocalHandlers: map[string]http.Handler{secretdump.Path: dump},
		})
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// workloadID derives the workload identity from Namespace/ServiceAccount
// when both are set, else from the token's kubernetes.io claims.
func workloadID(cfg Config) (spiffeid.ID, error) {
	if cfg.Namespace != "" && cfg.ServiceAccount != "" {
		return identity.ServiceAccount{Namespace: cfg.Namespace, Name: cfg.ServiceAccount}.ID(cfg.TrustDomain)
	}
	tok, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("--token-file: %w", err)
	}
	id, err := identity.IDFromToken(string(tok), cfg.TrustDomain)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("--token-file %s: %w", cfg.TokenFile, err)
	}
	return id, nil
}

// Manager is the agent's SecretManager.
func (a *Agent) Manager() *secretcache.Manager { return a.cache }

// SocketPath is the SDS socket's path.
func (a *Agent) SocketPath() string { return a.sds.SocketPath() }

// Ready is the agent's readiness (/readyz): nil once it holds a valid
// workload certificate.
func (a *Agent) Ready() error { return a.cache.Ready() }

// MonitoringAddr is the bound monitoring address, or nil before Listen or
// when monitoring is disabled.
func (a *Agent) MonitoringAddr() net.Addr {
	return a.monitor.Addr() // nil when disabled
}

// Listen creates the SDS socket and binds the monitoring address, so that
// both accept connections before Run. Run calls it when needed.
func (a *Agent) Listen() error {
	if a.monitor != nil {
		if err := a.monitor.Listen(); err != nil {
			return err
		}
	}
	if a.wlapi != nil {
		if err := a.wlapi.Listen(); err != nil {
			return err
		}
	}
	return a.sds.Listen()
}

// Dump is what the agent serves at /debug/secrets: its identity,
// readiness (with the CA's last failure while it backs off) and the
// certificate chain and roots it holds, never the key.
func (a *Agent) Dump() secretdump.Dump {
	d := secretdump.Dump{Identity: a.cache.ID().String(), Ready: true}
	if err := a.cache.Ready(); err != nil {
		d.Ready, d.Reason = false, err.Error()
		if last := a.cache.LastError(); last != nil {
			d.Reason += "; last CA failure: " + last.Error()
		}
	}
	cert, roots := a.cache.Current()
	if cert != nil {
		d.Secrets = append(d.Secrets, secretdump.Chain(cert.Name, cert.Version, cert.Chain, cert.NotAfter))
	}
	if roots != nil {
		d.Secrets = append(d.Secrets, secretdump.Roots(roots.Name, roots.Version, roots.Roots, roots.NotAfter))
	}
	return d
}

// RotateHandler forces a renewal of `default` (POST only); meshid-bench sds
// --rotate uses it to time a rotation across many streams. It is served at
// /debug/rotate on the monitoring listener.
func (a *Agent) RotateHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if err := a.cache.Rotate(r.Context()); err != nil {
			http.Error(w, "rotate: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "rotated")
	})
}

// Run serves until ctx ends or a component fails, and closes the CA
// client.
func (a *Agent) Run(ctx context.Context) error {
	if a.client != nil {
		defer a.client.Close()
	}
	if err := a.Listen(); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.cache.Run(ctx) })
	g.Go(func() error { return a.sds.Run(ctx) })
	attrs := []any{"sds_socket", a.sds.SocketPath(), "identity", a.cache.ID().String()}
	if a.monitor != nil {
		g.Go(func() error { return a.monitor.Run(ctx) })
		attrs = append(attrs, "monitoring", a.monitor.Addr().String())
	}
	if a.wlapi != nil {
		g.Go(func() error { return a.wlapi.Run(ctx) })
		attrs = append(attrs, "workload_api_socket", a.wlapi.SocketPath())
	}
	// Fetch the workload certificate at once, so the first proxy does not
	// wait for a CSR; failures are retried by the cache's scheduler.
	g.Go(func() error {
		if _, err := a.cache.Secret(ctx, secretcache.DefaultName); err != nil && ctx.Err() == nil {
			a.log.Warn("first certificate not obtained yet; retrying", logs.KeyError, err)
		}
		return nil
	})
	a.log.Info("meshid agent serving", attrs...)
	return g.Wait()
}
