package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults of Config.
const (
	// DefaultMaxClusters bounds the remote clusters (working or refused):
	// each holds two clients and a review cache, and is a value of the
	// cluster label.
	DefaultMaxClusters = 64
	// DefaultQPS and DefaultBurst limit each remote cluster's TokenReview
	// client (a remote cluster serves a share of the mesh; its node
	// informer has the controllers' limits of ca/kubeclient).
	DefaultQPS   = 100
	DefaultBurst = 200
	// DefaultProbeTimeout bounds the check of a new remote cluster.
	DefaultProbeTimeout = 10 * time.Second
)

// NodeAuthorizer is the local cluster's node authorization
// (*nodeauth.Authorizer).
type NodeAuthorizer interface {
	Authorize(ctx context.Context, caller *authn.Caller, impersonated spiffeid.ID) error
}

// Config configures a Router.
type Config struct {
	// LocalID is the CA's own cluster (--cluster-id); a request with this
	// ClusterID, or none, is the local cluster's. Default DefaultLocalID.
	LocalID string
	// Local authenticates the local cluster's tokens (the CA's
	// TokenReview); nil leaves them to the next authenticator of the chain.
	Local authn.Authenticator
	// LocalNode is the local cluster's node authorization; nil refuses
	// local impersonations.
	LocalNode NodeAuthorizer
	// Kubeconfigs are remote clusters from files (--remote-kubeconfig):
	// cluster ID to kubeconfig path. They are the operator's own files,
	// read like --kubeconfig, without Sanitize.
	Kubeconfigs map[string]string
	// Audiences a token must carry; default ["istio-ca"].
	Audiences []string
	// TrustedNodeAccounts and TrustDomain turn on node authorization for
	// remote callers, against their own cluster's pods; empty, a remote
	// caller's impersonation is refused.
	TrustedNodeAccounts []identity.ServiceAccount
	TrustDomain         spiffeid.TrustDomain
	// MaxClusters bounds the remote clusters; default DefaultMaxClusters.
	MaxClusters int
	// QPS and Burst limit each remote TokenReview client.
	QPS   float32
	Burst int
	// ProbeTimeout bounds the check of a newly configured cluster.
	ProbeTimeout time.Duration
	Clock        clock.Clock
	Logger       *slog.Logger          // nil discards logs
	Registerer   prometheus.Registerer // nil registers no metrics
}

// Router is an authn.Authenticator that sends each token to the API
// server of the cluster the request names, and a NodeAuthorizer that
// reads that cluster's pods. Set, Invalidate and Remove change the remote
// clusters at run time; Run runs their node informers.
type Router struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	mu      sync.RWMutex
	entries map[string]*entry
	runCtx  context.Context // nil before Run
}

// entry is a configured remote cluster: rem is nil when its kubeconfig
// was refused (Invalidate).
type entry struct {
	owner string // who configured it: "flag" or "secret <ns>/<name>"
	rem   *remote
}

// remote is one remote cluster's reviewer and node authorization.
type remote struct {
	id       string
	client   kubeclient.Interface
	reviewer *authn.TokenReview
	node     *nodeauth.Authorizer // nil without node mode
	cancel   context.CancelFunc   // stops node; nil until started
}

// OwnerFlag is the owner of the clusters of Config.Kubeconfigs.
const OwnerFlag = "flag --remote-kubeconfig"

// New validates cfg, applies its defaults and configures the clusters of
// cfg.Kubeconfigs (an unreadable file is an error).
func New(cfg Config) (*Router, error) {
	cfg.LocalID = cmp.Or(cfg.LocalID, DefaultLocalID)
	if err := CheckID(cfg.LocalID); err != nil {
		return nil, fmt.Errorf("cluster: local cluster: %w", err)
	}
	if len(cfg.Audiences) == 0 {
		cfg.Audiences = []string{authn.DefaultTokenAudience}
	}
	if cfg.MaxClusters < 0 || cfg.QPS < 0 || cfg.Burst < 0 || cfg.ProbeTimeout < 0 {
		return nil, errors.New("cluster: negative limit")
	}
	cfg.MaxClusters = cmp.Or(cfg.MaxClusters, DefaultMaxClusters)
	cfg.QPS = cmp.Or(cfg.QPS, DefaultQPS)
	cfg.Burst = cmp.Or(cfg.Burst, DefaultBurst)
	cfg.ProbeTimeout = cmp.Or(cfg.ProbeTimeout, DefaultProbeTimeout)
	if len(cfg.TrustedNodeAccounts) > 0 && cfg.TrustDomain.IsZero() {
		return nil, errors.New("cluster: node authorization needs Config.TrustDomain")
	}
	if len(cfg.Kubeconfigs) > cfg.MaxClusters {
		return nil, fmt.Errorf("cluster: %d remote kubeconfigs, more than the %d clusters allowed", len(cfg.Kubeconfigs), cfg.MaxClusters)
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	m, err := newMetrics(cfg.Registerer, cfg.LocalID)
	if err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, log: cfg.Logger, metrics: m, entries: map[string]*entry{}}
	for _, id := range slices.Sorted(maps.Keys(cfg.Kubeconfigs)) {
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfigs[id])
		if err != nil {
			return nil, fmt.Errorf("cluster: remote kubeconfig of %s: %w", id, err)
		}
		if err := r.Set(id, rc, OwnerFlag); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// LocalID is the local cluster's ID.
func (r *Router) LocalID() string { return r.cfg.LocalID }

// Clusters returns the IDs of the remote clusters that can review tokens.
func (r *Router) Clusters() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for id, e := range r.entries {
		if e.rem != nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Authenticate reviews creds.Token with the API server of
// creds.ClusterID's cluster: the local authenticator for an empty or local
// ID, the remote cluster's TokenReview otherwise. An unknown cluster is
// Unauthenticated (naming it), a remote API server that cannot answer
// Unavailable; both are final for the token (authn.FinalForToken), so that
// no later authenticator judges a token meant for another cluster.
func (r *Router) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	if creds.Token == "" {
		return nil, authn.ErrNoCredentials
	}
	start := r.cfg.Clock.Now()
	id := creds.ClusterID
	if id == "" || id == r.cfg.LocalID {
		if r.cfg.Local == nil {
			return nil, authn.ErrNoCredentials
		}
		c, err := r.cfg.Local.Authenticate(ctx, creds)
		if !errors.Is(err, authn.ErrNoCredentials) {
			r.metrics.observe(r.cfg.LocalID, r.cfg.Clock.Now().Sub(start), err)
		}
		return c, err
	}
	rem := r.remote(id)
	if rem == nil {
		err := unknownCluster(id, r.cfg.LocalID)
		r.metrics.observe(UnknownLabel, r.cfg.Clock.Now().Sub(start), err)
		return nil, authn.FinalForToken(err)
	}
	c, err := rem.reviewer.Authenticate(ctx, creds)
	if r.track(rem, err) {
		r.metrics.observe(id, r.cfg.Clock.Now().Sub(start), err)
	} else { // removed meanwhile: its series are gone and stay gone
		r.metrics.observe(UnknownLabel, r.cfg.Clock.Now().Sub(start), err)
	}
	if err != nil {
		return nil, err // TokenReview's errors are final for the token
	}
	c.Cluster = id
	return c, nil
}

// track updates a remote cluster's state after one of its reviews, and
// reports whether rem is still the cluster's configuration.
func (r *Router) track(rem *remote, err error) bool {
	state := StateReady
	if ca.KindOf(err) == ca.KindUnavailable {
		state = StateUnreachable
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	current := r.entries[rem.id]
	if current == nil || current.rem != rem {
		return false
	}
	r.metrics.setState(rem.id, state)
	return true
}

// Authorize is node authorization by the caller's cluster: the local
// NodeAuthorizer for a local caller, the remote cluster's pods for a
// remote one.
func (r *Router) Authorize(ctx context.Context, caller *authn.Caller, impersonated spiffeid.ID) error {
	if caller == nil || caller.Cluster == "" {
		if r.cfg.LocalNode == nil {
			return ca.Errorf(ca.KindPermissionDenied, "impersonation is off on this CA: no trusted node accounts or no Kubernetes client")
		}
		return r.cfg.LocalNode.Authorize(ctx, caller, impersonated)
	}
	rem := r.remote(caller.Cluster)
	switch {
	case rem == nil:
		return ca.Errorf(ca.KindPermissionDenied, "impersonation refused: cluster %q is no longer configured", caller.Cluster)
	case rem.node == nil:
		return ca.Errorf(ca.KindPermissionDenied, "impersonation refused: node authorization is off for remote cluster %q (no trusted node accounts)", caller.Cluster)
	}
	return rem.node.Authorize(ctx, caller, impersonated)
}

func (r *Router) remote(id string) *remote {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e := r.entries[id]; e != nil {
		return e.rem
	}
	return nil
}

// Set configures remote cluster id from rc, replacing the client the same
// owner configured before. It refuses the local ID, an invalid ID, an ID
// another owner configured, and a new cluster past MaxClusters.
func (r *Router) Set(id string, rc *rest.Config, owner string) error {
	if err := r.admit(id, owner); err != nil {
		return err
	}
	rem, err := r.newRemote(id, rc)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", id, err)
	}
	r.mu.Lock()
	if err := r.admitLocked(id, owner); err != nil {
		r.mu.Unlock()
		return err
	}
	old := r.entries[id]
	r.entries[id] = &entry{owner: owner, rem: rem}
	r.startLocked(rem)
	r.metrics.setState(id, StateConfigured) // series change with entries, under the lock
	r.mu.Unlock()
	old.stop()
	r.log.Info("remote cluster configured", logs.KeyCluster, id, logs.KeyFrom, owner)
	go r.probe(rem)
	return nil
}

// Invalidate records that owner's kubeconfig of cluster id was refused:
// the cluster's previous client, if any, is removed, and the state gauge
// shows it as invalid.
func (r *Router) Invalidate(id, owner string) error {
	r.mu.Lock()
	if err := r.admitLocked(id, owner); err != nil {
		r.mu.Unlock()
		return err
	}
	old := r.entries[id]
	r.entries[id] = &entry{owner: owner}
	r.metrics.setState(id, StateInvalid)
	r.mu.Unlock()
	old.stop()
	return nil
}

// Remove forgets remote cluster id if owner configured it; its requests
// are then refused as an unknown cluster's.
func (r *Router) Remove(id, owner string) {
	r.mu.Lock()
	old := r.entries[id]
	if old == nil || old.owner != owner {
		r.mu.Unlock()
		return
	}
	delete(r.entries, id)
	r.metrics.forget(id)
	r.mu.Unlock()
	old.stop()
	r.log.Info("remote cluster removed", logs.KeyCluster, id, logs.KeyFrom, owner)
}

func (r *Router) admit(id, owner string) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.admitLocked(id, owner)
}

func (r *Router) admitLocked(id, owner string) error {
	if err := CheckID(id); err != nil {
		return err
	}
	if id == r.cfg.LocalID {
		return fmt.Errorf("cluster %s is the local cluster (--cluster-id)", id)
	}
	e := r.entries[id]
	switch {
	case e != nil && e.owner != owner:
		return fmt.Errorf("cluster %s is already configured by %s", id, e.owner)
	case e == nil && len(r.entries) >= r.cfg.MaxClusters:
		return fmt.Errorf("cluster %s: already %d remote clusters, the most allowed", id, r.cfg.MaxClusters)
	}
	return nil
}

func (e *entry) stop() {
	if e != nil && e.rem != nil && e.rem.cancel != nil {
		e.rem.cancel()
	}
}

// Run runs the remote clusters' node informers until ctx ends.
func (r *Router) Run(ctx context.Context) error {
	r.mu.Lock()
	r.runCtx = ctx
	for _, e := range r.entries {
		if e.rem != nil {
			r.startLocked(e.rem)
		}
	}
	r.mu.Unlock()
	<-ctx.Done()
	return nil
}

// startLocked starts rem's node informer once Run has begun.
func (r *Router) startLocked(rem *remote) {
	if rem.node == nil || r.runCtx == nil || rem.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.runCtx)
	rem.cancel = cancel
	go func() { _ = rem.node.Run(ctx) }()
}
