package agent

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/sds/secretcache"
)

// Defaults of a Config: the flag defaults of `meshid agent`.
const (
	DefaultCAAddr           = "127.0.0.1:15012"
	DefaultTokenFile        = "./var/run/secrets/tokens/istio-token"
	DefaultSDSSocket        = "./var/run/secrets/workload-spiffe-uds/socket"
	DefaultCertTTL          = 24 * time.Hour
	DefaultGraceRatio       = 0.5
	DefaultJitter           = 0.01
	DefaultKeyType          = certs.ECP256
	DefaultMonitoringListen = "127.0.0.1:15020"
	DefaultTrustDomain      = "cluster.local"
)

// NoJitter is the Jitter that disables renewal jitter.
const NoJitter = -1

// Config configures the agent. The zero value of a field takes its default
// (the constants above) unless its comment says otherwise.
type Config struct {
	// CAAddr is the address of the CA's CreateCertificate API.
	CAAddr string
	// Signer, when set, obtains the certificates instead of a CA client on
	// CAAddr (embedding, tests): the CA* fields and ClusterID are then not
	// used.
	Signer secretcache.Signer
	// CARoots verify the CA's serving certificate; when empty they are
	// read from CARootFile (PEM). One of them is required: the agent only
	// talks to a CA it can verify.
	CARoots    []*x509.Certificate
	CARootFile string
	// CARootRefresh, when positive, re-reads CARootFile that often and
	// adds its roots to those of the CA's answers, in ROOTCA and for
	// verifying the CA (a CA rotation's new root arrives from either). 0:
	// never re-read (no default applied: cmd sets
	// secretcache.DefaultRootRefresh, 5m).
	CARootRefresh time.Duration
	// FederationRefresh is how often the federated bundles are asked of
	// the CA; 0 takes secretcache.DefaultFederationRefresh (15s).
	FederationRefresh time.Duration
	// MaxCARoots bounds the roots of CARoots and CARootFile, at start and
	// at every re-read: more is a system CA bundle rather than the mesh's
	// roots (ROOTCA would trust the public web PKI). 0 means
	// rootfile.DefaultMaxRoots (16).
	MaxCARoots int
	// TokenFile is the service-account token, re-read for every CA request.
	TokenFile string
	// SDSSocket is the Unix socket Envoy SDS is served on.
	SDSSocket string
	// WorkloadAPISocket, when set, serves the SPIFFE Workload API
	// (sds/workloadendpoint) on this Unix socket from the same cache as SDS.
	// Empty: off.
	WorkloadAPISocket string
	// SocketGroup makes the sockets 0660 instead of 0600.
	SocketGroup bool
	// CertTTL is the requested workload certificate TTL.
	CertTTL time.Duration
	// GraceRatio: renew after this fraction of the lifetime, in (0,1].
	GraceRatio float64
	// Jitter is the ± fraction of the lifetime by which renewal moves at
	// random; NoJitter (any negative value) disables it.
	Jitter float64
	// KeyType is the workload key.
	KeyType certs.KeyType
	// TrustDomain of the workload identity.
	TrustDomain spiffeid.TrustDomain
	// ClusterID is sent in CSR metadata when set.
	ClusterID string
	// Namespace and ServiceAccount name the workload when both are set;
	// otherwise the identity comes from the token's kubernetes.io claims.
	Namespace      string
	ServiceAccount string
	// MonitoringListen is the address of /metrics /healthz /readyz. Empty
	// disables monitoring (no default applied: cmd sets
	// DefaultMonitoringListen).
	MonitoringListen string
	// DebugEndpoints serves POST /debug/rotate on the monitoring listener,
	// which must then be a loopback address: the endpoint has no
	// authentication (security review, hole 6). Off by default.
	DebugEndpoints bool
	// DisableDebugSecrets turns off GET /debug/secrets (the chain and
	// roots held, never a key; `meshid inspect --pod` reads it), which is
	// otherwise served with monitoring to loopback peers only: the path
	// then answers 404 saying it is off.
	DisableDebugSecrets bool
	// FileSecretDirs are the only directories file-cert: and file-root:
	// resources may read; nil is secretcache's default (./etc/certs and
	// /etc/certs), empty and non-nil refuses every file resource.
	FileSecretDirs []string

	Clock  clock.Clock  // nil is the real clock
	Logger *slog.Logger // nil discards logs
	// Registerer takes the metrics; nil is a new registry. Gatherer serves
	// /metrics; nil is Registerer when it is a Gatherer.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// withDefaults returns cfg with defaults applied, or why it is invalid:
// every invalid field at once (errors.Join), each error naming its field.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	cfg.CAAddr = cmp.Or(cfg.CAAddr, DefaultCAAddr)
	cfg.TokenFile = cmp.Or(cfg.TokenFile, DefaultTokenFile)
	cfg.SDSSocket = cmp.Or(cfg.SDSSocket, DefaultSDSSocket)
	cfg.CertTTL = cmp.Or(cfg.CertTTL, DefaultCertTTL)
	if cfg.CertTTL < 0 {
		errs = append(errs, fmt.Errorf("agent: CertTTL %v is negative", cfg.CertTTL))
	}
	if cfg.MaxCARoots < 0 {
		errs = append(errs, fmt.Errorf("agent: MaxCARoots %d is negative", cfg.MaxCARoots))
	}
	cfg.GraceRatio = cmp.Or(cfg.GraceRatio, DefaultGraceRatio)
	cfg.Jitter = cmp.Or(cfg.Jitter, DefaultJitter)
	cfg.KeyType = cmp.Or(cfg.KeyType, DefaultKeyType)
	if _, err := certs.ParseKeyType(string(cfg.KeyType)); err != nil {
		errs = append(errs, fmt.Errorf("agent: KeyType: %w", err))
	}
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = spiffeid.RequireTrustDomainFromString(DefaultTrustDomain)
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	return cfg, errors.Join(errs...)
}

// withMetrics returns cfg with its Registerer and Gatherer defaults.
func (cfg Config) withMetrics() (Config, error) {
	var ok bool
	cfg.Registerer, cfg.Gatherer, ok = monitor.Registry(cfg.Registerer, cfg.Gatherer)
	if !ok && cfg.MonitoringListen != "" {
		return cfg, errors.New("agent: monitoring needs a Gatherer")
	}
	return cfg, nil
}

// ManagerConfig is the SecretManager's configuration the agent runs with
// cfg: its defaults applied, signer and id as given. Tests that run many
// SecretManagers without the rest of the agent (test/storm) build them
// with it.
func (cfg Config) ManagerConfig(signer secretcache.Signer, id spiffeid.ID) (secretcache.Config, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return secretcache.Config{}, err
	}
	// A signer that also mints JWT-SVIDs (caclient.Client) serves them.
	jwtSigner, _ := signer.(secretcache.JWTSigner)
	// And one that asks for the federated bundles (caclient.Client) serves
	// them: ROOTCA_FEDERATED, the Workload API's federated bundles.
	federation, _ := signer.(secretcache.FederationSource)
	return secretcache.Config{
		Signer:     signer,
		JWTSigner:  jwtSigner,
		Federation: federation,
		ID:         id,
		KeyType:    cfg.KeyType,
		TTL:        cfg.CertTTL,
		GraceRatio: cfg.GraceRatio,
		Jitter:     cfg.Jitter,
		// FileSecretDirs: hole 4 of the security review.
		FileSecretDirs: cfg.FileSecretDirs,
		RootFile:       cfg.rootFile(),
		RootRefresh:    cfg.CARootRefresh,
		MaxRoots:       cfg.MaxCARoots,
		OnRoots:        trustHook(signer),
		Clock:          cfg.Clock,
		Logger:         cfg.Logger,
		Registerer:     cfg.Registerer,

		FederationRefresh: cfg.FederationRefresh, // 0: secretcache's default
	}, nil
}

// rootFile is the root file the Manager re-reads: CARootFile when it
// verifies the CA and CARootRefresh is on.
func (cfg Config) rootFile() string {
	if cfg.CARootRefresh <= 0 || len(cfg.CARoots) > 0 || cfg.Signer != nil {
		return ""
	}
	return cfg.CARootFile
}

// trustHook is the CA client's SetRoots: it verifies the CA with every new
// ROOTCA bundle. nil for a signer that has none.
func trustHook(signer secretcache.Signer) func([]*x509.Certificate) {
	if s, ok := signer.(interface{ SetRoots([]*x509.Certificate) }); ok {
		return s.SetRoots
	}
	return nil
}
