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
// (the constants above) unless its comment says otherwise.
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
	// RotationPropagation is how long a new CA with new roots is prepared
	// (its roots in the bundle, the old CA signing) before it signs; 0
	// takes ca/rotation's default (10m, twice the agents' root refresh).
	RotationPropagation time.Duration
	// RootRotationThreshold prepares a new self-signed root when less than
	// this is left of the current one; 0 takes ca/rotation's default (1
	// year), negative turns it off. Only for the self-signed root.
	RootRotationThreshold time.Duration
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
	// DefaultTTL is the workload certificate TTL when a request asks for
	// none; MaxTTL the longest allowed.
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// ServingTTL is the lifetime of the CA's own serving certificate; 0
	// means ca/certservice's default.
	ServingTTL time.Duration
	// ServingDNS are extra DNS SANs of the serving certificate.
	ServingDNS []string
	// RateLimit is per-caller CreateCertificate requests per second; 0 is
	// unlimited (no default applied). RateBurst is the per-caller burst;
	// 0 is ca/certservice's default (RateLimit rounded up).
	RateLimit float64
	RateBurst int
	// CapTTLToToken caps a token-proved leaf at the token's expiry (off by
	// default, as Istio: see SECURITY.md for the trade-off).
	CapTTLToToken bool
	// MaxConnections and MaxConnectionsPerIP bound the gRPC listener's open
	// connections; FirstRequestTimeout closes a connection that sends no
	// request in time. 0 takes ca/certservice's defaults.
	MaxConnections      int
	MaxConnectionsPerIP int
	FirstRequestTimeout time.Duration
	// JWTSVIDTTL is the lifetime of the JWT-SVIDs the CA mints
	// (meshid.v1.JWTSVIDService); 0 is jwtissuer.DefaultTTL (5m), at most
	// jwtissuer.MaxTTL (1h). JWTKeyLifetime is how long one JWT signing key
	// signs (and is published before it does); 0 is
	// jwtkeys.DefaultLifetime (24h), within jwtkeys.MinLifetime (10m) and
	// MaxLifetime (30 days). With a Kubernetes client the replicas share
	// the keys through a Secret (ca/kube/jwtsecret); without one they are
	// kept under StateDir (not with Bundle, which keeps them in memory).
	JWTSVIDTTL     time.Duration
	JWTKeyLifetime time.Duration

	// Kubeconfig is the kubeconfig of the TokenReview client. Empty means
	// the in-cluster config when running in a pod, else no client.
	Kubeconfig string
	// KubeClient, when set, is used instead of Kubeconfig, for both
	// TokenReview and the controllers.
	KubeClient kubeclient.Interface
	// KubeQPS and KubeBurst limit the TokenReview client's requests to the
	// API server; 0 takes ca/kubeclient's defaults, sized for a restart
	// storm. The controllers (election, publisher) have a client of their
	// own, so that they never starve authentication.
	KubeQPS   float32
	KubeBurst int
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
	// KubeCASecret keeps the CA in a Secret of Namespace, elects a leader
	// and publishes the root ConfigMap (ca/kube); it needs a client. With
	// Upstream the Secret is UpstreamSecret, written by the leader.
	KubeCASecret bool
	// Namespace is the CA's own namespace.
	Namespace string
	// PodName is this replica's identity for leader election; empty means
	// the hostname followed by "_" and a random suffix (as Kubernetes'
	// own controllers do), so that two replicas on one host (no pod name
	// from the downward API) never share an identity and both lead.
	PodName string

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
	// always to the API server. It needs a client built from Kubeconfig
	// or the in-cluster config (not KubeClient) for its metadata informers.
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
	// ClusterID names the CA's own cluster (--cluster-id, Istio's
	// CLUSTER_ID): a request whose ClusterID metadata is empty or this is
	// reviewed by the local API server. Default cluster.DefaultLocalID.
	ClusterID string
	// RemoteKubeconfigs are remote clusters from files
	// (--remote-kubeconfig ID=PATH): cluster ID to kubeconfig path. A
	// request naming one is reviewed by that cluster's API server.
	RemoteKubeconfigs map[string]string
	// RemoteSecrets watches Istio remote secrets in Namespace (label
	// istio/multiCluster=true, each data key a cluster ID, its value a
	// kubeconfig) and adds, replaces and removes remote clusters as they
	// change. It needs a Kubernetes client allowed to list and watch
	// Secrets in Namespace.
	RemoteSecrets bool
	// InsecureKubeconfigOptions allows what remote secrets' kubeconfigs
	// may otherwise not use (cluster.Option...: exec, tokenFile,
	// clientCertificate, clientKey, certificateAuthority, or an auth
	// provider's name). Empty: none.
	InsecureKubeconfigOptions []string
	// TrustDomainAliases are trust domains whose identities this CA also
	// accepts in client-certificate renewals (--trust-domain-aliases).
	TrustDomainAliases []spiffeid.TrustDomain
	// ExtraAuthenticators are tried after the configured ones (dev, tests).
	ExtraAuthenticators []authn.Authenticator

	// BundleEndpoint, when its Listen is set, serves the trust domain's
	// SPIFFE bundle to federated trust domains (ca/spiffefed).
	BundleEndpoint spiffefed.EndpointConfig
	// FederateWith are the federated trust domains whose bundles the CA
	// fetches, keeps (under StateDir) and hands to the agents
	// (--federate-with, spiffefed.ParsePeers).
	FederateWith []spiffefed.Peer

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

	// MonitoringListen is the address of /metrics /healthz /readyz. Empty
	// disables monitoring (no default applied: cmd sets
	// DefaultMonitoringListen).
	MonitoringListen string
	// Pprof serves Go profiles at /debug/pprof/ on the monitoring listener.
	Pprof bool

	// GCPercent is the garbage collector's target (GOGC) that Run sets for
	// the whole process: 0 is DefaultGCPercent, negative leaves the
	// runtime's own setting (cmd passes -1 when GOGC is in the
	// environment, so an operator's GOGC wins).
	GCPercent int
	// MemoryLimit is the soft memory limit (GOMEMLIMIT) in bytes that Run
	// sets; 0 leaves the runtime's (GOMEMLIMIT from the environment, else
	// none). deploy/ and the Helm chart set GOMEMLIMIT to the container's
	// memory limit (downward API), which the high default GCPercent needs;
	// no flag sets this field.
	MemoryLimit int64

	Clock  clock.Clock  // nil is the real clock
	Logger *slog.Logger // nil discards logs
	// Registerer takes the metrics; nil is a new registry. Gatherer serves
	// /metrics; nil is Registerer when it is a Gatherer.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// withDefaults returns cfg with defaults applied, or why it is invalid.
func (cfg Config) withDefaults() (Config, error) {
	cfg.Listen = cmp.Or(cfg.Listen, DefaultListen)
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = spiffeid.RequireTrustDomainFromString(DefaultTrustDomain)
	}
	cfg.StateDir = cmp.Or(cfg.StateDir, DefaultStateDir)
	cfg.RootKeyType = cmp.Or(cfg.RootKeyType, DefaultRootKeyType)
	if _, err := certs.ParseKeyType(string(cfg.RootKeyType)); err != nil {
		return cfg, fmt.Errorf("caserver: root key type: %w", err)
	}
	cfg.DefaultTTL = cmp.Or(cfg.DefaultTTL, DefaultTTL)
	cfg.MaxTTL = cmp.Or(cfg.MaxTTL, DefaultMaxTTL)
	if cfg.DefaultTTL < 0 || cfg.MaxTTL < 0 || cfg.ServingTTL < 0 || cfg.RotationPropagation < 0 {
		return cfg, errors.New("caserver: negative TTL")
	}
	if cfg.RootRotationThreshold >= keystore.DefaultRootTTL {
		// Every new root would be due at once: rotations without end.
		return cfg, fmt.Errorf("caserver: root rotation threshold %v is not shorter than the root's lifetime %v", cfg.RootRotationThreshold, keystore.DefaultRootTTL)
	}
	if err := cfg.checkUpstream(); err != nil {
		return cfg, err
	}
	if cfg.RateLimit < 0 || cfg.RateBurst < 0 {
		return cfg, errors.New("caserver: negative rate limit")
	}
	if len(cfg.TokenAudiences) == 0 {
		cfg.TokenAudiences = []string{DefaultTokenAudience}
	}
	cfg.JWTSVIDTTL = cmp.Or(cfg.JWTSVIDTTL, jwtissuer.DefaultTTL)
	cfg.JWTKeyLifetime = cmp.Or(cfg.JWTKeyLifetime, jwtkeys.DefaultLifetime)
	if cfg.JWTSVIDTTL < 0 || cfg.JWTSVIDTTL > jwtissuer.MaxTTL {
		return cfg, fmt.Errorf("caserver: JWT-SVID TTL %s is not within 0 to %s", cfg.JWTSVIDTTL, jwtissuer.MaxTTL)
	}
	if _, err := jwtkeys.CheckLifetime(cfg.JWTKeyLifetime, cfg.JWTSVIDTTL); err != nil {
		return cfg, fmt.Errorf("caserver: %w", err)
	}
	cfg.Namespace = cmp.Or(cfg.Namespace, DefaultNamespace)
	cfg.GCPercent = cmp.Or(cfg.GCPercent, DefaultGCPercent)
	if cfg.MemoryLimit < 0 {
		return cfg, errors.New("caserver: negative memory limit")
	}
	cfg.TokenVerification = cmp.Or(cfg.TokenVerification, boundtoken.DefaultMode)
	if _, err := boundtoken.ParseMode(string(cfg.TokenVerification)); err != nil {
		return cfg, fmt.Errorf("caserver: %w", err)
	}
	cfg.ClusterID = cmp.Or(cfg.ClusterID, cluster.DefaultLocalID)
	if cfg.APIServerProbeInterval < 0 {
		return cfg, errors.New("caserver: negative API server probe interval")
	}
	if cfg.KubeQPS < 0 || cfg.KubeBurst < 0 || cfg.MaxConnections < 0 || cfg.MaxConnectionsPerIP < 0 || cfg.FirstRequestTimeout < 0 {
		return cfg, errors.New("caserver: negative Kubernetes rate limit or connection limit")
	}
	if cfg.PodName == "" {
		h, err := os.Hostname()
		if err != nil {
			return cfg, fmt.Errorf("caserver: pod name: %w", err)
		}
		cfg.PodName = h + "_" + rand.Text()[:12]
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	var ok bool
	cfg.Registerer, cfg.Gatherer, ok = monitor.Registry(cfg.Registerer, cfg.Gatherer)
	if !ok && cfg.MonitoringListen != "" {
		return cfg, errors.New("caserver: monitoring needs a Gatherer")
	}
	return cfg, nil
}
