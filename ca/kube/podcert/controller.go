package podcert

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	apivalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/metadata"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults of Config.
const (
	// DefaultLeaseName is the Lease the signer's replicas elect a leader
	// with, apart from the CA's own, so that signing runs whatever else
	// the CA does in the cluster.
	DefaultLeaseName = "meshid-pod-certificates"
	// DefaultWorkers is how many requests are judged and signed at once:
	// the most requests in flight (each costs one status write; signing is
	// about 0.2 ms of CPU).
	DefaultWorkers = 16
	// DefaultBundleSuffix ends the ClusterTrustBundle's name.
	DefaultBundleSuffix = "roots"
	// DefaultRootPollInterval is how often the root source is checked for
	// new roots (a pointer comparison).
	DefaultRootPollInterval = time.Second
	// DefaultGraceRatio and DefaultJitter place status.beginRefreshAt as
	// the agent places its renewal: at half the lifetime, ±1%.
	DefaultGraceRatio = 0.5
	DefaultJitter     = 0.01
	// DefaultMaxRetries bounds the attempts at a request that fails for a
	// reason that may pass but is not the CA being unavailable (an
	// internal signing error); then it is Failed. Unavailable is retried
	// until the request is garbage-collected.
	DefaultMaxRetries = 10
)

// Signer signs a leaf: *ca.Authority, the CA's one signing path.
type Signer interface {
	Sign(ctx context.Context, req ca.Request) (*ca.Issued, error)
}

// RootSource holds the CA's current bundle, whose Roots are what the CA
// hands out with every certificate (*ca.Authority). Bundle may return nil
// while the CA is not built yet.
type RootSource interface {
	Bundle() *keystore.Bundle
}

// Config configures a Controller.
type Config struct {
	// SignerName is the spec.signerName this CA signs for, a qualified
	// name such as meshid.io/workload. Required.
	SignerName string
	// Client reads and writes PodCertificateRequests and the
	// ClusterTrustBundle, reads pods, and elects. Required.
	Client kubeclient.Interface
	// Metadata lists and watches service accounts and nodes, metadata
	// only. Required.
	Metadata metadata.Interface
	// Namespace holds the Lease (the CA's namespace). Required.
	Namespace string
	// Candidate: the Lease (LeaseName "" = DefaultLeaseName), this
	// replica's Identity (required) and the election's timing.
	election.Candidate

	// TrustDomain of the identities signed. Required.
	TrustDomain spiffeid.TrustDomain
	// Signer signs every certificate; Roots are published. Required.
	Signer Signer
	Roots  RootSource
	// DefaultTTL and MaxTTL are the CA's (--default-ttl, --max-ttl): the
	// lifetime is min(spec.maxExpirationSeconds, MaxTTL, DefaultTTL),
	// never under the API server's minimum of an hour. 0 = the ca
	// package's defaults.
	DefaultTTL, MaxTTL time.Duration

	// Workers, BundleSuffix, RootPollInterval, GraceRatio, Jitter,
	// MaxRetries: 0 = the Default… constants.
	Workers          int
	BundleSuffix     string
	RootPollInterval time.Duration
	GraceRatio       float64
	Jitter           float64
	MaxRetries       int

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// Controller is the pod certificate signer and trust bundle publisher of
// one CA replica.
type Controller struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	metrics *metrics
	elector *election.Elector
	bundle  *trustBundle

	mu      sync.Mutex
	leading *run // the leader's signer, nil on a follower
}

// New validates cfg and builds the Controller. It starts nothing.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.Client == nil || cfg.Metadata == nil:
		return nil, errors.New("podcert: Client and Metadata are required")
	case cfg.Signer == nil || cfg.Roots == nil:
		return nil, errors.New("podcert: Signer and Roots are required")
	case cfg.TrustDomain.IsZero():
		return nil, errors.New("podcert: TrustDomain is required")
	case cfg.Workers < 0 || cfg.MaxRetries < 0 || cfg.RootPollInterval < 0 || cfg.DefaultTTL < 0 || cfg.MaxTTL < 0:
		return nil, errors.New("podcert: negative workers, retries, interval or TTL")
	case cfg.GraceRatio < 0 || cfg.GraceRatio >= 1 || cfg.Jitter < 0 || cfg.Jitter >= 0.5:
		return nil, fmt.Errorf("podcert: grace ratio %v must be in [0,1) and jitter %v in [0,0.5)", cfg.GraceRatio, cfg.Jitter)
	}
	if err := ValidateSignerName(cfg.SignerName); err != nil {
		return nil, err
	}
	cfg.LeaseName = cmp.Or(cfg.LeaseName, DefaultLeaseName)
	cfg.Workers = cmp.Or(cfg.Workers, DefaultWorkers)
	cfg.BundleSuffix = cmp.Or(cfg.BundleSuffix, DefaultBundleSuffix)
	cfg.RootPollInterval = cmp.Or(cfg.RootPollInterval, DefaultRootPollInterval)
	cfg.GraceRatio = cmp.Or(cfg.GraceRatio, DefaultGraceRatio)
	cfg.Jitter = cmp.Or(cfg.Jitter, DefaultJitter)
	cfg.MaxRetries = cmp.Or(cfg.MaxRetries, DefaultMaxRetries)
	cfg.DefaultTTL = cmp.Or(cfg.DefaultTTL, ca.DefaultTTL)
	cfg.MaxTTL = cmp.Or(cfg.MaxTTL, ca.DefaultMaxTTL)
	if errs := apivalidation.IsDNS1123Label(cfg.BundleSuffix); len(errs) > 0 {
		return nil, fmt.Errorf("podcert: bundle suffix %q: %s", cfg.BundleSuffix, strings.Join(errs, "; "))
	}
	log := logs.OrDiscard(cfg.Logger).With("component", "podcert", "signer", cfg.SignerName)
	c := &Controller{cfg: cfg, clock: clock.OrReal(cfg.Clock), log: log}
	var err error
	if c.metrics, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	c.bundle = newTrustBundle(c)
	// The election keeps wall time, as the CA's own does: a test that
	// steps the fake clock by hours must not hand leadership around.
	c.elector, err = election.New(election.Config{
		Client:       cfg.Client,
		Namespace:    cfg.Namespace,
		Candidate:    cfg.Candidate,
		Lead:         c.lead,
		Logger:       log,
		Registerer:   cfg.Registerer,
		LeaderMetric: "meshid_ca_pod_certificate_leader",
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ValidateSignerName checks name as the API server checks a signer name:
// a domain-prefixed path (domain/path), whose domain is not kubernetes.io
// or one of its subdomains (reserved to Kubernetes).
func ValidateSignerName(name string) error {
	domain, path, ok := strings.Cut(name, "/")
	if !ok || path == "" || domain == "" {
		return fmt.Errorf("podcert: signer name %q is not <domain>/<path>", name)
	}
	if errs := apivalidation.IsDNS1123Subdomain(domain); len(errs) > 0 {
		return fmt.Errorf("podcert: signer name %q: domain: %s", name, strings.Join(errs, "; "))
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return fmt.Errorf("podcert: signer name %q: the kubernetes.io domain is reserved", name)
	}
	if len(name) > 571 || strings.ContainsAny(path, " \t\n") {
		return fmt.Errorf("podcert: signer name %q is not a valid signer path", name)
	}
	return nil
}

// BundleName is the ClusterTrustBundle's name: the signer name with "/"
// as ":", then ":" and the suffix (the API server requires that prefix of
// a bundle with spec.signerName).
func (c *Controller) BundleName() string {
	return strings.ReplaceAll(c.cfg.SignerName, "/", ":") + ":" + c.cfg.BundleSuffix
}

// Run campaigns for the Lease until ctx ends; the leader signs and
// publishes.
func (c *Controller) Run(ctx context.Context) error {
	return c.elector.Run(ctx)
}

// IsLeader reports whether this replica signs now.
func (c *Controller) IsLeader() bool { return c.elector.IsLeader() }

// lead runs the signer and the trust bundle until leadership ends.
func (c *Controller) lead(ctx context.Context) {
	c.log.Info("leading: signing pod certificate requests and publishing the trust bundle", logs.KeyBundle, c.BundleName())
	var wg sync.WaitGroup
	wg.Go(func() { c.bundle.run(ctx) })
	wg.Go(func() {
		if err := c.sign(ctx); err != nil {
			c.log.Error("pod certificate signer stopped", logs.KeyError, err)
		}
	})
	wg.Wait()
	c.log.Info("no longer leading")
}
