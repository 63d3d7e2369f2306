package kubeclient

import (
	"cmp"
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Defaults of Config.
//
// Auth: a mass restart (a node pool upgrade, a cluster-wide rollout) makes
// every pod present a fresh token at once, and each fresh token costs one
// TokenReview (reviews are cached and shared per token, so never more).
// One replica must be able to absorb that alone, since the other may be
// the one restarting. Measured on the 2-core test machine, one API server
// answers about 600 reviews per second (docs/benchmarks.md): QPS 500 keeps
// the client below what one API server answers, and burst 1000 lets the
// first thousand pods through without waiting in the client at all. A real
// control plane has more API servers and cores; the server side bounds the
// CA with its FlowSchema (deploy/30-flowcontrol.yaml), so a larger fleet
// raises these, never the reverse.
//
// Controllers: the steady load is a Lease renewal every 2s and watches; the
// peak is a root rotation updating one ConfigMap per namespace. QPS 50
// writes 3,000 namespaces in a minute, and burst 100 covers the initial
// lists and a small cluster's writes at once.
const (
	DefaultQPS             = 500
	DefaultBurst           = 1000
	DefaultControllerQPS   = 50
	DefaultControllerBurst = 100
	DefaultUserAgent       = "meshid"
)

// ErrNotInCluster is returned by NewClients when Config.Kubeconfig is empty and
// the process does not run in a pod: there is no Kubernetes to talk to.
var ErrNotInCluster = rest.ErrNotInCluster

// Config configures NewClients.
type Config struct {
	// Kubeconfig is the path of a kubeconfig file; "" means the in-cluster
	// config (the pod's service account).
	Kubeconfig string
	// QPS and Burst limit the Auth client's requests; 0 = DefaultQPS and
	// DefaultBurst.
	QPS   float32
	Burst int
	// ControllerQPS and ControllerBurst limit the Controllers client;
	// 0 = DefaultControllerQPS and DefaultControllerBurst.
	ControllerQPS   float32
	ControllerBurst int
	// UserAgent prefixes both clients' User-Agent, which the API server's
	// audit log and metrics show; "" = DefaultUserAgent.
	UserAgent string
}

// Clients are the CA's two Kubernetes clients.
type Clients struct {
	// Auth sends TokenReviews (and SubjectAccessReviews). Its transport
	// counts the API server's 429 answers for the requests made with a
	// context of OnThrottled.
	Auth Interface
	// Controllers serves leader election, the root ConfigMap publisher,
	// the CA Secret store and their informers.
	Controllers Interface

	// AuthConfig and ControllerConfig are the configs the clients were
	// built from (copies; for tests and diagnostics).
	AuthConfig, ControllerConfig *rest.Config
}

// NewClients validates cfg, applies the defaults and builds the clients. It makes
// no request. Without a kubeconfig outside a pod it returns an error
// matching ErrNotInCluster.
func NewClients(cfg Config) (*Clients, error) {
	if cfg.QPS < 0 || cfg.ControllerQPS < 0 {
		return nil, fmt.Errorf("kubeclient: negative QPS (%v, controllers %v)", cfg.QPS, cfg.ControllerQPS)
	}
	if cfg.Burst < 0 || cfg.ControllerBurst < 0 {
		return nil, fmt.Errorf("kubeclient: negative burst (%d, controllers %d)", cfg.Burst, cfg.ControllerBurst)
	}
	cfg.QPS = cmp.Or(cfg.QPS, DefaultQPS)
	cfg.Burst = cmp.Or(cfg.Burst, DefaultBurst)
	cfg.ControllerQPS = cmp.Or(cfg.ControllerQPS, DefaultControllerQPS)
	cfg.ControllerBurst = cmp.Or(cfg.ControllerBurst, DefaultControllerBurst)
	cfg.UserAgent = cmp.Or(cfg.UserAgent, DefaultUserAgent)
	// client-go's token bucket cannot hold more than burst at once; a QPS
	// above the burst would be a bucket that refills faster than it holds.
	if float32(cfg.Burst) < cfg.QPS || float32(cfg.ControllerBurst) < cfg.ControllerQPS {
		return nil, fmt.Errorf("kubeclient: burst below QPS (%d < %v or controllers %d < %v)",
			cfg.Burst, cfg.QPS, cfg.ControllerBurst, cfg.ControllerQPS)
	}
	base, err := load(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	out := &Clients{
		AuthConfig:       withLimits(base, cfg.QPS, cfg.Burst, cfg.UserAgent+"/tokenreview"),
		ControllerConfig: withLimits(base, cfg.ControllerQPS, cfg.ControllerBurst, cfg.UserAgent+"/controllers"),
	}
	// The API server's 429s to the CA's reviews, which client-go retries
	// without a word, reach the review that asked (OnThrottled).
	out.AuthConfig.Wrap(CountThrottled)
	if out.Auth, err = New(rest.CopyConfig(out.AuthConfig)); err != nil {
		return nil, fmt.Errorf("kubeclient: TokenReview client: %w", err)
	}
	if out.Controllers, err = New(rest.CopyConfig(out.ControllerConfig)); err != nil {
		return nil, fmt.Errorf("kubeclient: controllers client: %w", err)
	}
	return out, nil
}

func load(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeclient: kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, ErrNotInCluster
	}
	if err != nil {
		return nil, fmt.Errorf("kubeclient: in-cluster config: %w", err)
	}
	return cfg, nil
}

// withLimits returns a copy of base with its own rate limiter settings.
// Each clientset built from it gets its own token bucket, so the two
// clients never wait for each other. (They may share one HTTP/2
// connection through client-go's transport cache; streams on it are not
// rate limited by the client.)
func withLimits(base *rest.Config, qps float32, burst int, userAgent string) *rest.Config {
	c := rest.CopyConfig(base)
	c.QPS, c.Burst = qps, burst
	c.RateLimiter = nil // a kubeconfig cannot set one; never share one
	c.UserAgent = userAgent
	// Protobuf for the built-in types the CA uses: cheaper to encode and
	// decode than JSON on both sides.
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return c
}
