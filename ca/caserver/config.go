package caserver

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/cluster"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/monitor"
)

// Defaults of a Config: the flag defaults of `meshid server`.
const (
	DefaultListen           = "127.0.0.1:15012"
	DefaultTrustDomain      = "cluster.local"
	DefaultStateDir         = "./var/lib/meshid"
	DefaultRootKeyType      = certs.ECP256
	DefaultTTL              = 24 * time.Hour
	DefaultMaxTTL           = 2160 * time.Hour
	DefaultTokenAudience    = "istio-ca"
	DefaultMonitoringListen = "127.0.0.1:15014"
	DefaultNamespace        = "istio-system"
	// DefaultGCPercent: the CA's live heap is small and its garbage is
	// per request, so Go's GOGC=100 collected every few hundred
	// certificates; at 400 the GC's mark work is a small fraction of what
	// it was (the measured figures: docs/benchmarks.md), for a heap that
	// peaks at five times the live one instead of twice.
	DefaultGCPercent = 400
)

// Config configures the CA. The zero value of a field takes its default
// (the constants above) unless its comment says otherwise. The fields at
// the top say what the CA is and where its key comes from; the groups
// below them configure one part each.
type Config struct {
	// Listen is the TCP address of the gRPC CSR API (always TLS).
	Listen string
	// TrustDomain of issued identities.
	TrustDomain spiffeid.TrustDomain
	// Bundle, when set, is the CA material itself (embedding, tests);
	// CADir, StateDir and KubeCASecret are then not used.
	Bundle *keystore.Bundle
	// CADir is a plugged-in CA directory (ca-cert.pem ca-key.pem
	// cert-chain.pem root-cert.pem, or tls.crt tls.key ca.crt). Empty means
	// a self-signed root in StateDir, or the Kubernetes Secret with
	// KubeCASecret.
	CADir string
	// StateDir holds the self-signed root (key mode 0600); root-cert.pem is
	// written there for clients.
	StateDir string
	// RootKeyType is the key of a self-signed root.
	RootKeyType certs.KeyType
	// CAKey, when set, is the CA key in a PKCS#11 module: it signs, and
	// never leaves the module; the certificates still come from CADir or
	// StateDir (whose self-signed root is then made for this key). Not
	// used with Bundle or KubeCASecret.
	CAKey *pkcs11.URI
	// KubeCASecret keeps the CA in a Secret of Kube.Namespace, elects a
	// leader and publishes the root ConfigMap (ca/kube); it needs a client.
	// With Upstream the Secret is UpstreamSecret, written by the leader.
	KubeCASecret bool
	// Upstream, when its URL is set, has the organisation's CA mint and
	// renew the CA's intermediate (ca/upstream); not with Bundle or CADir.
	// With CAKey, each intermediate's key is created in the module
	// (CAKey's label, a new id each time); not with KubeCASecret too. With
	// KubeCASecret the elected replica mints and every replica signs with
	// the intermediate it keeps in UpstreamSecret.
	Upstream UpstreamConfig
	// AdminSocket, when set, is the Unix socket (mode 0600) of the local
	// admin API (`meshid certs activate`, `rotate-root`, `inspect --ca`).
	AdminSocket string

	Rotation   RotationConfig   // CA rotation (ca/rotation)
	Issuance   IssuanceConfig   // workload certificates' lifetimes
	JWT        JWTConfig        // JWT-SVIDs and their signing keys
	Serving    ServingConfig    // the CA's own serving certificate
	Limits     LimitsConfig     // per-caller rates, connections
	Authn      AuthnConfig      // who a caller is (ca/authn)
	Kube       KubeConfig       // the Kubernetes client and what runs on it
	Clusters   ClustersConfig   // multi-cluster token review (ca/cluster)
	Federation FederationConfig // SPIFFE federation (ca/spiffefed)
	Monitoring MonitoringConfig // /metrics /healthz /readyz
	Runtime    RuntimeConfig    // the Go runtime's GC settings

	Clock  clock.Clock  // nil is the real clock
	Logger *slog.Logger // nil discards logs
	// Registerer takes the metrics; nil is a new registry. Gatherer serves
	// /metrics; nil is Registerer when it is a Gatherer.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// RotationConfig is the CA rotation's timing (ca/rotation).
type RotationConfig struct {
	// Propagation is how long a new CA with new roots is prepared (its
	// roots in the bundle, the old CA signing) before it signs; 0 takes
	// ca/rotation's default (10m, twice the agents' root refresh).
	Propagation time.Duration
	// RootThreshold prepares a new self-signed root when less than this
	// is left of the current one; 0 takes ca/rotation's default (1 year),
	// negative turns it off. Only for the self-signed root.
	RootThreshold time.Duration
}

// IssuanceConfig bounds the workload certificates the CA signs.
type IssuanceConfig struct {
	// DefaultTTL is the workload certificate TTL when a request asks for
	// none; MaxTTL the longest allowed.
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// CapTTLToToken caps a token-proved leaf at the token's expiry (off by
	// default, as Istio: see SECURITY.md for the trade-off).
	CapTTLToToken bool
}

// JWTConfig configures the JWT-SVIDs the CA mints
// (meshid.v1.JWTSVIDService).
type JWTConfig struct {
	// SVIDTTL is the lifetime of a JWT-SVID; 0 is jwtissuer.DefaultTTL
	// (5m), at most jwtissuer.MaxTTL (1h). KeyLifetime is how long one
	// JWT signing key signs (and is published before it does); 0 is
	// jwtkeys.DefaultLifetime (24h), within jwtkeys.MinLifetime (10m) and
	// MaxLifetime (30 days). With a Kubernetes client the replicas share
	// the keys through a Secret (ca/kube/jwtsecret); without one they are
	// kept under StateDir (not with Bundle, which keeps them in memory).
	SVIDTTL     time.Duration
	KeyLifetime time.Duration
}

// ServingConfig is the CA's own serving certificate.
type ServingConfig struct {
	// CertTTL is its lifetime; 0 means ca/certservice's default.
	CertTTL time.Duration
	// DNSNames are extra DNS SANs of it.
	DNSNames []string
}

// LimitsConfig bounds what callers of the gRPC API may take.
type LimitsConfig struct {
	// Rate is per-caller CreateCertificate requests per second; 0 is
	// unlimited (no default applied). Burst is the per-caller burst; 0 is
	// ca/certservice's default (Rate rounded up).
	Rate  float64
	Burst int
	// MaxConnections and MaxConnectionsPerIP bound the gRPC listener's open
	// connections; FirstRequestTimeout closes a connection that sends no
	// request in time. 0 takes ca/certservice's defaults.
	MaxConnections      int
	MaxConnectionsPerIP int
	FirstRequestTimeout time.Duration
}

// AuthnConfig configures how callers are authenticated and what a node
// agent may ask for (ca/authn, ca/nodeauth).
type AuthnConfig struct {
	// TokenAudiences a service-account token must carry.
	TokenAudiences []string
	// JWTIssuer and JWKSFile enable offline JWT authentication (the JWKS
	// from the issuer's discovery unless JWKSFile is set). Both empty
	// disables it.
	JWTIssuer string
	JWKSFile  string
	// MaxTokenLifetime bounds an offline JWT's exp past its iat; 0 is
	// ca/authn's default (48h), negative no bound.
	MaxTokenLifetime time.Duration
	// TokenVerification chooses who verifies the cluster's bound tokens
	// (ca/authn/boundtoken): "auto" (default) verifies them in the CA once
	// the issuer's keys are discovered and the informers synced, and sends
	// them to TokenReview until then; "local" only in the CA; "tokenreview"
	// always to the API server. It needs a client built from
	// Kube.Kubeconfig or the in-cluster config (not Kube.Client) for its
	// metadata informers.
	TokenVerification boundtoken.Mode
	// TokenReviewIssuers are the issuers whose tokens TokenReview judges
	// (finally); empty means every token, so the offline JWT check only
	// sees tokens when there is no Kubernetes client.
	TokenReviewIssuers []string
	// TrustedNodeAccounts are the node agents (Istio's ztunnel) that may
	// impersonate the pods on their own node (ImpersonatedIdentity, with
	// ca/nodeauth's node authorization). Empty: node mode off, every
	// impersonation refused. It needs a Kubernetes client to see pods.
	TrustedNodeAccounts []identity.ServiceAccount
	// TrustDomainAliases are trust domains whose identities this CA also
	// accepts in client-certificate renewals (--trust-domain-aliases).
	TrustDomainAliases []spiffeid.TrustDomain
	// Extra authenticators are tried after the configured ones (dev,
	// tests).
	Extra []authn.Authenticator
}

// KubeConfig is the CA's Kubernetes client and the controllers that run
// on it.
type KubeConfig struct {
	// Kubeconfig is the kubeconfig of the TokenReview client. Empty means
	// the in-cluster config when running in a pod, else no client.
	Kubeconfig string
	// Client, when set, is used instead of Kubeconfig, for both
	// TokenReview and the controllers.
	Client kubeclient.Interface
	// QPS and Burst limit the TokenReview client's requests to the API
	// server; 0 takes ca/kubeclient's defaults, sized for a restart storm.
	// The controllers (election, publisher) have a client of their own,
	// so that they never starve authentication.
	QPS   float32
	Burst int
	// DisableRootConfigMap turns off the istio-ca-root-cert publisher (and
	// the leader election it needs) that otherwise runs whenever there is
	// a Kubernetes client, whatever holds the CA key.
	DisableRootConfigMap bool
	// RootConfigMapNamespaces selects the namespaces that get the root
	// ConfigMap; nil is all but kube-system, kube-public, kube-node-lease.
	RootConfigMapNamespaces labels.Selector
	// PodCertificateSigner, when set, makes the CA the signer of that name
	// (e.g. meshid.io/workload) for Kubernetes PodCertificateRequests and
	// publishes its roots as a ClusterTrustBundle of that signer
	// (ca/kube/podcert, docs/pod-certificates.md). Empty is off. It needs
	// a client from Kubeconfig or the in-cluster config.
	PodCertificateSigner string
	// PodCertificateRefresh places a pod certificate's
	// status.beginRefreshAt at this fraction of its lifetime (podcert's
	// GraceRatio); 0 = podcert.DefaultGraceRatio, as the agent renews.
	PodCertificateRefresh float64
	// Namespace is the CA's own namespace.
	Namespace string
	// PodName is this replica's identity for leader election; empty means
	// the hostname followed by "_" and a random suffix (as Kubernetes'
	// own controllers do), so that two replicas on one host (no pod name
	// from the downward API) never share an identity and both lead.
	PodName string
	// APIServerGrace is how long the local Kubernetes API server may go
	// without answering the CA's probe (GET /readyz every
	// APIServerProbeInterval) before Ready reports the CA not ready,
	// unless local token verification has synced; a replica that has
	// never had an answer is not ready. 0 is reachability.DefaultGrace
	// (30s); negative turns the probe and the check off.
	APIServerGrace time.Duration
	// APIServerProbeInterval is the time between two probes; 0 is
	// reachability.DefaultInterval (5s).
	APIServerProbeInterval time.Duration
}

// ClustersConfig routes token reviews to the caller's cluster
// (ca/cluster).
type ClustersConfig struct {
	// ID names the CA's own cluster (--cluster-id, Istio's CLUSTER_ID): a
	// request whose ClusterID metadata is empty or this is reviewed by the
	// local API server. Default cluster.DefaultLocalID.
	ID string
	// RemoteKubeconfigs are remote clusters from files
	// (--remote-kubeconfig ID=PATH): cluster ID to kubeconfig path. A
	// request naming one is reviewed by that cluster's API server.
	RemoteKubeconfigs map[string]string
	// RemoteSecrets watches Istio remote secrets in Kube.Namespace (label
	// istio/multiCluster=true, each data key a cluster ID, its value a
	// kubeconfig) and adds, replaces and removes remote clusters as they
	// change. It needs a Kubernetes client allowed to list and watch
	// Secrets in Kube.Namespace.
	RemoteSecrets bool
	// InsecureKubeconfigOptions allows what remote secrets' kubeconfigs
	// may otherwise not use (cluster.Option...: exec, tokenFile,
	// clientCertificate, clientKey, certificateAuthority, or an auth
	// provider's name). Empty: none.
	InsecureKubeconfigOptions []string
}

// FederationConfig is SPIFFE federation (ca/spiffefed).
type FederationConfig struct {
	// BundleEndpoint, when its Listen is set, serves the trust domain's
	// SPIFFE bundle to federated trust domains.
	BundleEndpoint spiffefed.EndpointConfig
	// Peers are the federated trust domains whose bundles the CA fetches,
	// keeps (under StateDir) and hands to the agents (--federate-with,
	// spiffefed.ParsePeers).
	Peers []spiffefed.Peer
}

// MonitoringConfig is the monitoring listener.
type MonitoringConfig struct {
	// Listen is the address of /metrics /healthz /readyz. Empty disables
	// monitoring (no default applied: cmd sets DefaultMonitoringListen).
	Listen string
	// Pprof serves Go profiles at /debug/pprof/ on the monitoring listener.
	Pprof bool
}

// RuntimeConfig is what Run sets in the Go runtime, for the whole process.
type RuntimeConfig struct {
	// GCPercent is the garbage collector's target (GOGC): 0 is
	// DefaultGCPercent, negative leaves the runtime's own setting (cmd
	// passes -1 when GOGC is in the environment, so an operator's GOGC
	// wins).
	GCPercent int
	// MemoryLimit is the soft memory limit (GOMEMLIMIT) in bytes; 0 leaves
	// the runtime's (GOMEMLIMIT from the environment, else none). deploy/
	// and the Helm chart set GOMEMLIMIT to the container's memory limit
	// (downward API), which the high default GCPercent needs; no flag sets
	// this field.
	MemoryLimit int64
}

// withDefaults returns cfg with defaults applied, or why it is invalid:
// every invalid field at once (errors.Join), each error naming its field.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("caserver: "+format, args...))
	}
	cfg.Listen = cmp.Or(cfg.Listen, DefaultListen)
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = spiffeid.RequireTrustDomainFromString(DefaultTrustDomain)
	}
	cfg.StateDir = cmp.Or(cfg.StateDir, DefaultStateDir)
	cfg.RootKeyType = cmp.Or(cfg.RootKeyType, DefaultRootKeyType)
	if _, err := certs.ParseKeyType(string(cfg.RootKeyType)); err != nil {
		bad("RootKeyType: %w", err)
	}
	if err := cfg.checkUpstream(); err != nil {
		errs = append(errs, err)
	}

	if cfg.Rotation.Propagation < 0 {
		bad("Rotation.Propagation %v is negative", cfg.Rotation.Propagation)
	}
	if cfg.Rotation.RootThreshold >= keystore.DefaultRootTTL {
		// Every new root would be due at once: rotations without end.
		bad("Rotation.RootThreshold %v is not shorter than the root's lifetime %v", cfg.Rotation.RootThreshold, keystore.DefaultRootTTL)
	}

	cfg.Issuance.DefaultTTL = cmp.Or(cfg.Issuance.DefaultTTL, DefaultTTL)
	cfg.Issuance.MaxTTL = cmp.Or(cfg.Issuance.MaxTTL, DefaultMaxTTL)
	if cfg.Issuance.DefaultTTL < 0 {
		bad("Issuance.DefaultTTL %v is negative", cfg.Issuance.DefaultTTL)
	}
	if cfg.Issuance.MaxTTL < 0 {
		bad("Issuance.MaxTTL %v is negative", cfg.Issuance.MaxTTL)
	}
	if cfg.Serving.CertTTL < 0 {
		bad("Serving.CertTTL %v is negative", cfg.Serving.CertTTL)
	}

	cfg.JWT.SVIDTTL = cmp.Or(cfg.JWT.SVIDTTL, jwtissuer.DefaultTTL)
	cfg.JWT.KeyLifetime = cmp.Or(cfg.JWT.KeyLifetime, jwtkeys.DefaultLifetime)
	if cfg.JWT.SVIDTTL < 0 || cfg.JWT.SVIDTTL > jwtissuer.MaxTTL {
		bad("JWT.SVIDTTL %s is not within 0 to %s", cfg.JWT.SVIDTTL, jwtissuer.MaxTTL)
	} else if _, err := jwtkeys.CheckLifetime(cfg.JWT.KeyLifetime, cfg.JWT.SVIDTTL); err != nil {
		bad("JWT.KeyLifetime: %w", err)
	}

	if cfg.Limits.Rate < 0 {
		bad("Limits.Rate %v is negative", cfg.Limits.Rate)
	}
	if cfg.Limits.Burst < 0 {
		bad("Limits.Burst %d is negative", cfg.Limits.Burst)
	}
	if cfg.Limits.MaxConnections < 0 {
		bad("Limits.MaxConnections %d is negative", cfg.Limits.MaxConnections)
	}
	if cfg.Limits.MaxConnectionsPerIP < 0 {
		bad("Limits.MaxConnectionsPerIP %d is negative", cfg.Limits.MaxConnectionsPerIP)
	}
	if cfg.Limits.FirstRequestTimeout < 0 {
		bad("Limits.FirstRequestTimeout %v is negative", cfg.Limits.FirstRequestTimeout)
	}

	if len(cfg.Authn.TokenAudiences) == 0 {
		cfg.Authn.TokenAudiences = []string{DefaultTokenAudience}
	}
	cfg.Authn.TokenVerification = cmp.Or(cfg.Authn.TokenVerification, boundtoken.DefaultMode)
	if _, err := boundtoken.ParseMode(string(cfg.Authn.TokenVerification)); err != nil {
		bad("Authn.TokenVerification: %w", err)
	}

	cfg.Kube.Namespace = cmp.Or(cfg.Kube.Namespace, DefaultNamespace)
	if cfg.Kube.QPS < 0 {
		bad("Kube.QPS %v is negative", cfg.Kube.QPS)
	}
	if cfg.Kube.Burst < 0 {
		bad("Kube.Burst %d is negative", cfg.Kube.Burst)
	}
	if cfg.Kube.APIServerProbeInterval < 0 {
		bad("Kube.APIServerProbeInterval %v is negative", cfg.Kube.APIServerProbeInterval)
	}
	if cfg.Kube.PodName == "" {
		h, err := os.Hostname()
		if err != nil {
			bad("Kube.PodName: %w", err)
		} else {
			cfg.Kube.PodName = h + "_" + rand.Text()[:12]
		}
	}

	cfg.Clusters.ID = cmp.Or(cfg.Clusters.ID, cluster.DefaultLocalID)

	cfg.Runtime.GCPercent = cmp.Or(cfg.Runtime.GCPercent, DefaultGCPercent)
	if cfg.Runtime.MemoryLimit < 0 {
		bad("Runtime.MemoryLimit %d is negative", cfg.Runtime.MemoryLimit)
	}

	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	var ok bool
	cfg.Registerer, cfg.Gatherer, ok = monitor.Registry(cfg.Registerer, cfg.Gatherer)
	if !ok && cfg.Monitoring.Listen != "" {
		bad("Monitoring.Listen needs a Gatherer")
	}
	return cfg, errors.Join(errs...)
}
