package kube

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/ca/kube/secretstore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// Config configures a Controller. Zero values take the defaults of the
// election, secretstore and rootpublisher packages.
type Config struct {
	Client      kubernetes.Interface // required
	Namespace   string               // the CA's namespace (POD_NAMESPACE); required
	Identity    string               // this replica, e.g. the pod name; required
	TrustDomain string               // required; names the self-signed root

	RootKeyType certs.KeyType // key of a self-signed root created by the leader
	RootTTL     time.Duration // its lifetime; 0 = the keystore default

	SecretName        string // "" = "meshid-ca"
	PluggedSecretName string // "" = "cacerts"
	ConfigMapName     string // "" = "istio-ca-root-cert"
	LeaseName         string // "" = "meshid-ca"

	LeaseDuration time.Duration // 0 = 15s
	RenewDeadline time.Duration // 0 = 10s
	RetryPeriod   time.Duration // 0 = 2s

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil = slog.Default()
	Registerer prometheus.Registerer // nil = no metrics
}

// Controller runs the CA's Kubernetes features. Create it with New, then
// Run it; use Bind or Subscribe to feed its bundles to the Authority.
type Controller struct {
	log       *slog.Logger
	store     *secretstore.Store
	publisher *rootpublisher.Publisher
	elector   *election.Elector
}

// New validates cfg and builds the Controller. It starts nothing.
func New(cfg Config) (*Controller, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	store, err := secretstore.New(secretstore.Config{
		Client:            cfg.Client,
		Namespace:         cfg.Namespace,
		SecretName:        cfg.SecretName,
		PluggedSecretName: cfg.PluggedSecretName,
		TrustDomain:       cfg.TrustDomain,
		KeyType:           cfg.RootKeyType,
		RootTTL:           cfg.RootTTL,
		Clock:             cfg.Clock,
		Logger:            log,
		Registerer:        cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	pub, err := rootpublisher.New(rootpublisher.Config{
		Client:        cfg.Client,
		ConfigMapName: cfg.ConfigMapName,
		Logger:        log,
		Registerer:    cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	c := &Controller{log: log, store: store, publisher: pub}
	c.elector, err = election.New(election.Config{
		Client:        cfg.Client,
		Namespace:     cfg.Namespace,
		LeaseName:     cfg.LeaseName,
		Identity:      cfg.Identity,
		LeaseDuration: cfg.LeaseDuration,
		RenewDeadline: cfg.RenewDeadline,
		RetryPeriod:   cfg.RetryPeriod,
		Lead:          c.lead,
		Logger:        log,
		Registerer:    cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	// The publisher follows the store's roots for the Controller's lifetime.
	store.Subscribe(func(b *keystore.Bundle) { pub.SetRoots(b.Roots) })
	return c, nil
}

// Run watches the CA Secrets and campaigns for leadership until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.store.Run(ctx) })
	g.Go(func() error { return c.elector.Run(ctx) })
	return g.Wait()
}

// lead runs the leader-only tasks until ctx ends.
func (c *Controller) lead(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := c.store.Bootstrap(ctx); err != nil {
			c.log.Error("kube: root Secret bootstrap stopped", "error", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := c.publisher.Run(ctx); err != nil {
			c.log.Error("kube: root ConfigMap publisher stopped", "error", err)
		}
	}()
	wg.Wait()
}

// Ready returns nil once a CA bundle has been loaded from a Secret.
func (c *Controller) Ready() error { return c.store.Ready() }

// Bundle returns the CA bundle in use, or nil before the first load.
func (c *Controller) Bundle() *keystore.Bundle { return c.store.Bundle() }

// Source returns the name of the Secret the bundle came from, or "".
func (c *Controller) Source() string { return c.store.Source() }

// WaitForBundle blocks until a bundle is loaded (Run must be running) or
// ctx ends. Use its result to construct the Authority.
func (c *Controller) WaitForBundle(ctx context.Context) (*keystore.Bundle, error) {
	return c.store.WaitForBundle(ctx)
}

// Subscribe calls fn with the current bundle, if any, and with every new
// one. fn must be quick and must not call Subscribe or Bind.
func (c *Controller) Subscribe(fn func(*keystore.Bundle)) (cancel func()) {
	return c.store.Subscribe(fn)
}

// BundleSetter takes a new CA bundle; *ca.Authority is one.
type BundleSetter interface {
	SetBundle(*keystore.Bundle) error
}

// Bind hands the current bundle and every later one to s, logging (and
// otherwise ignoring) bundles that s rejects.
func (c *Controller) Bind(s BundleSetter) (cancel func()) {
	return c.store.Subscribe(func(b *keystore.Bundle) {
		if err := s.SetBundle(b); err != nil {
			c.log.Error("kube: the Authority rejected the new CA bundle; keeping the previous one",
				"source", c.store.Source(), "error", err)
		}
	})
}

// IsLeader reports whether this replica runs the leader-only tasks.
func (c *Controller) IsLeader() bool { return c.elector.IsLeader() }

// Leader returns the identity of the last observed leader, or "".
func (c *Controller) Leader() string { return c.elector.Leader() }
