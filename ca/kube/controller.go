package kube

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/ca/kube/secretstore"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// RootSource holds the CA's current bundle; *ca.Authority is one.
type RootSource interface {
	Bundle() *keystore.Bundle
}

// DefaultRootPollInterval is how often a Controller with a RootSource looks
// for a new bundle: a pointer comparison, so cheap; a root change reaches
// the ConfigMaps within about this long.
const DefaultRootPollInterval = time.Second

// Config configures a Controller. Zero values take the defaults of the
// election, secretstore and rootpublisher packages.
//
// Where the CA key lives decides the mode:
//
//   - Roots nil: in a Secret. Every replica loads and watches it
//     (secretstore), the leader creates a self-signed one when none exists,
//     and the leader publishes its roots.
//   - Roots set: elsewhere (a state directory, a mounted cacerts directory,
//     an HSM). The Controller only elects a leader, which publishes the
//     roots the source holds and follows their changes (and runs Lead).
type Config struct {
	// Client is the controllers' client (ca/kubeclient's Controllers),
	// never the one that sends TokenReviews. Required.
	Client    kubeclient.Interface
	Namespace string // the CA's namespace (POD_NAMESPACE); required
	// Candidate is the CA's Lease (LeaseName "" = "meshid-ca"), this
	// replica (Identity, e.g. the pod name; required) and the election's
	// timing (0 = 15s lease, 10s renew deadline, 2s retry period).
	election.Candidate
	// TrustDomain names the self-signed root; required without Roots.
	TrustDomain string

	// Roots is the bundle to publish when the key is not in a Secret;
	// nil = the Secret keystore.
	Roots RootSource
	// RootPollInterval is how often Roots is checked for a new bundle;
	// 0 = DefaultRootPollInterval.
	RootPollInterval time.Duration

	// DisablePublisher turns the root ConfigMap publisher off (a mesh
	// where istiod still publishes it). With Roots set and the publisher
	// off, the Controller has nothing to do and does not elect.
	DisablePublisher bool
	// PublishNamespaces selects the namespaces that get the root
	// ConfigMap; nil = rootpublisher.DefaultNamespaceSelector (all but
	// kube-system, kube-public, kube-node-lease).
	PublishNamespaces labels.Selector

	// Lead is a further leader-only task (the upstream CA's minting
	// replica, ca/caserver): it runs while this replica leads, and its ctx
	// ends when it stops leading. With Lead set the Controller elects even
	// when it has nothing else to lead.
	Lead func(ctx context.Context)

	RootKeyType certs.KeyType // key of a self-signed root created by the leader
	RootTTL     time.Duration // its lifetime; 0 = the keystore default

	SecretName        string // "" = "meshid-ca"
	PluggedSecretName string // "" = "cacerts"
	ConfigMapName     string // "" = "istio-ca-root-cert"

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// Controller runs the CA's Kubernetes features. Create it with New, then
// Run it; use Bind or Subscribe to feed its bundles to the Authority.
type Controller struct {
	log       *slog.Logger
	clock     clock.Clock
	roots     RootSource               // nil in the Secret mode
	poll      time.Duration            // of roots
	store     *secretstore.Store       // nil unless the Secret mode
	publisher *rootpublisher.Publisher // nil when disabled
	elector   *election.Elector        // nil when there is nothing to lead
	extra     func(context.Context)    // Config.Lead; nil if none
	// rotated is set by PublishRoots: from then on a CA rotation, not the
	// store, says which roots the publisher publishes.
	rotated atomic.Bool
}

// New validates cfg and builds the Controller. It starts nothing.
func New(cfg Config) (*Controller, error) {
	log := logs.OrDiscard(cfg.Logger)
	if cfg.RootPollInterval < 0 {
		return nil, fmt.Errorf("kube: negative root poll interval %s", cfg.RootPollInterval)
	}
	cfg.RootPollInterval = cmp.Or(cfg.RootPollInterval, DefaultRootPollInterval)
	c := &Controller{log: log, clock: clock.OrReal(cfg.Clock), roots: cfg.Roots, poll: cfg.RootPollInterval, extra: cfg.Lead}
	if cfg.Roots == nil {
		if err := c.newStore(cfg); err != nil {
			return nil, err
		}
	} else if cfg.Client == nil {
		return nil, errors.New("kube: Client is required")
	}
	if !cfg.DisablePublisher {
		pub, err := rootpublisher.New(rootpublisher.Config{
			Client:        cfg.Client,
			ConfigMapName: cfg.ConfigMapName,
			Namespaces:    cfg.PublishNamespaces,
			Clock:         cfg.Clock,
			Logger:        log,
			Registerer:    cfg.Registerer,
		})
		if err != nil {
			return nil, err
		}
		c.publisher = pub
	}
	if c.store == nil && c.publisher == nil && c.extra == nil {
		return c, nil // nothing a leader would do
	}
	// The election keeps wall time (no Clock): tests that step this
	// Controller's fake clock by whole poll intervals would otherwise make
	// the leader miss its renew deadline at each step and hand leadership
	// back and forth.
	var err error
	c.elector, err = election.New(election.Config{
		Client:     cfg.Client,
		Namespace:  cfg.Namespace,
		Candidate:  cfg.Candidate,
		Lead:       c.lead,
		Logger:     log,
		Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	if c.store != nil && c.publisher != nil {
		// The publisher follows the store's roots for the Controller's lifetime.
		c.store.Subscribe(func(b *keystore.Bundle) {
			if !c.rotated.Load() {
				c.publisher.SetRoots(b.Roots)
			}
		})
	}
	return c, nil
}

// newStore builds the Secret keystore.
func (c *Controller) newStore(cfg Config) error {
	store, err := secretstore.New(secretstore.Config{
		Client:            cfg.Client,
		Namespace:         cfg.Namespace,
		SecretName:        cfg.SecretName,
		PluggedSecretName: cfg.PluggedSecretName,
		TrustDomain:       cfg.TrustDomain,
		KeyType:           cfg.RootKeyType,
		RootTTL:           cfg.RootTTL,
		Clock:             cfg.Clock,
		Logger:            c.log,
		Registerer:        cfg.Registerer,
	})
	if err != nil {
		return err
	}
	c.store = store
	return nil
}

// Run watches the CA Secrets (or the RootSource) and campaigns for
// leadership until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if c.store != nil {
		g.Go(func() error { return c.store.Run(ctx) })
	}
	if c.roots != nil && c.publisher != nil {
		g.Go(func() error { c.followRoots(ctx); return nil })
	}
	if c.elector != nil {
		g.Go(func() error { return c.elector.Run(ctx) })
	}
	<-ctx.Done()
	return g.Wait()
}

// followRoots hands the RootSource's roots to the publisher now and
// whenever its bundle changes. Polling an atomic pointer is what lets any
// key holder (a state directory, a watched cacerts mount, a Secret) feed
// the publisher without telling it.
func (c *Controller) followRoots(ctx context.Context) {
	var last *keystore.Bundle
	clock.Loop(ctx, c.clock, 0, nil, func(context.Context) time.Duration {
		if b := c.roots.Bundle(); b != nil && b != last {
			c.publisher.SetRoots(b.Roots) // a no-op when the roots did not change
			last = b
		}
		return c.poll
	})
}

// lead runs the leader-only tasks until ctx ends.
func (c *Controller) lead(ctx context.Context) {
	var wg sync.WaitGroup
	if c.store != nil {
		wg.Go(func() {
			if err := c.store.Bootstrap(ctx); err != nil {
				c.log.Error("kube: root Secret bootstrap stopped", logs.KeyError, err)
			}
		})
	}
	if c.publisher != nil {
		wg.Go(func() {
			if err := c.publisher.Run(ctx); err != nil {
				c.log.Error("kube: root ConfigMap publisher stopped", logs.KeyError, err)
			}
		})
	}
	if c.extra != nil {
		wg.Go(func() { c.extra(ctx) })
	}
	wg.Wait()
}

// Ready returns nil once a CA bundle has been loaded from a Secret (in the
// Secret mode) and while the publisher, on the leader, has no namespace
// failing for longer than its grace period.
func (c *Controller) Ready() error {
	if c.store != nil {
		if err := c.store.Ready(); err != nil {
			return err
		}
	}
	if c.publisher != nil {
		return c.publisher.Ready()
	}
	return nil
}

// Bundle returns the CA bundle in use, or nil before the first load.
func (c *Controller) Bundle() *keystore.Bundle {
	if c.store == nil {
		return c.roots.Bundle()
	}
	return c.store.Bundle()
}

// Source returns the name of the Secret the bundle came from, or "" (and
// always "" with a RootSource).
func (c *Controller) Source() string {
	if c.store == nil {
		return ""
	}
	return c.store.Source()
}

// WaitForBundle blocks until a bundle is loaded (Run must be running) or
// ctx ends. Use its result to construct the Authority. With a RootSource it
// returns the source's bundle.
func (c *Controller) WaitForBundle(ctx context.Context) (*keystore.Bundle, error) {
	if c.store == nil {
		return c.roots.Bundle(), nil
	}
	return c.store.WaitForBundle(ctx)
}

// Subscribe calls fn with the current bundle, if any, and with every new
// one. fn must be quick and must not call Subscribe or Bind. With a
// RootSource there is nothing to subscribe to (the source is the
// Authority): fn is not called.
func (c *Controller) Subscribe(fn func(*keystore.Bundle)) (cancel func()) {
	if c.store == nil {
		return func() {}
	}
	return c.store.Subscribe(fn)
}

// BundleSetter takes a new CA bundle; *ca.Authority is one.
type BundleSetter interface {
	SetBundle(*keystore.Bundle) error
}

// Bind hands the current bundle and every later one to s, logging (and
// otherwise ignoring) bundles that s rejects.
func (c *Controller) Bind(s BundleSetter) (cancel func()) {
	if c.store == nil {
		return func() {}
	}
	return c.store.Subscribe(func(b *keystore.Bundle) {
		if err := s.SetBundle(b); err != nil {
			c.log.Error("kube: the Authority rejected the new CA bundle; keeping the previous one",
				logs.KeySource, c.store.Source(), logs.KeyError, err)
		}
	})
}

// PublishRoots makes roots the bundle to publish, from now on instead of
// the Secret's roots: a CA rotation (ca/rotation) publishes the union of
// the old and new roots while the Secret holds only the new CA. A no-op
// without a publisher.
func (c *Controller) PublishRoots(roots []*x509.Certificate) {
	if c.publisher == nil {
		return
	}
	c.rotated.Store(true)
	c.publisher.SetRoots(roots)
}

// IsLeader reports whether this replica runs the leader-only tasks.
func (c *Controller) IsLeader() bool { return c.elector != nil && c.elector.IsLeader() }

// Leader returns the identity of the last observed leader, or "".
func (c *Controller) Leader() string {
	if c.elector == nil {
		return ""
	}
	return c.elector.Leader()
}
