package podcert

import (
	"bytes"
	"context"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// trustBundle keeps the signer's ClusterTrustBundle equal to the roots of
// the root source. It is the leader's: one writer.
type trustBundle struct {
	c    *Controller
	name string
}

func newTrustBundle(c *Controller) *trustBundle { return &trustBundle{c: c, name: c.BundleName()} }

// run publishes until ctx ends: at once, whenever the roots change (polled
// every RootPollInterval, a pointer read and a PEM comparison) and
// whenever the bundle is edited or deleted; a failed write is retried at
// the next poll.
func (t *trustBundle) run(ctx context.Context) {
	c := t.c
	factory := kubeclient.NewInformerFactory(c.cfg.Client, 0, kubeclient.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", t.name).String()
	}))
	inf := factory.ClusterTrustBundles()
	wake := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return
	}
	lister := inf.Lister()
	// The poll keeps wall time, as the election does: a test that steps
	// the CA's fake clock by hours (a rotation's retirement) still sees
	// the bundle follow within a second.
	clock.Loop(ctx, clock.Real{}, 0, wake, func(ctx context.Context) time.Duration {
		b := c.cfg.Roots.Bundle()
		if b == nil {
			return c.cfg.RootPollInterval
		}
		if err := t.reconcile(ctx, lister, certs.EncodeCertificates(b.Roots...)); err != nil {
			if ctx.Err() == nil {
				c.log.Warn("cannot publish the ClusterTrustBundle; retrying", logs.KeyBundle, t.name, logs.KeyError, err)
			}
		}
		return c.cfg.RootPollInterval
	})
}

// reconcile makes the bundle hold want (a PEM of the roots), writing only
// when it differs.
func (t *trustBundle) reconcile(ctx context.Context, lister certlisters.ClusterTrustBundleLister, want []byte) error {
	c := t.c
	client := c.cfg.Client.CertificatesV1().ClusterTrustBundles()
	cur, err := lister.Get(t.name)
	if apierrors.IsNotFound(err) {
		_, err = client.Create(ctx, &certificatesv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: t.name, Labels: map[string]string{rootpublisher.ManagedByLabel: rootpublisher.ManagedByValue}},
			Spec:       certificatesv1.ClusterTrustBundleSpec{SignerName: c.cfg.SignerName, TrustBundle: string(want)},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create: %w", err) // AlreadyExists: the cache is behind
		}
		c.metrics.bundle.WithLabelValues("create").Inc()
		c.log.Info("created the ClusterTrustBundle", logs.KeyBundle, t.name)
		return nil
	}
	if err != nil {
		return err
	}
	if cur.Spec.TrustBundle == string(want) && cur.Spec.SignerName == c.cfg.SignerName &&
		cur.Labels[rootpublisher.ManagedByLabel] == rootpublisher.ManagedByValue {
		return nil
	}
	if cur.Spec.SignerName != c.cfg.SignerName {
		// spec.signerName is immutable: a bundle of that name made by
		// someone else for another signer is replaced.
		if err := client.Delete(ctx, t.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete a bundle of signer %q: %w", cur.Spec.SignerName, err)
		}
		return nil // recreated when the deletion is seen
	}
	upd := cur.DeepCopy()
	upd.Spec.TrustBundle = string(want)
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	upd.Labels[rootpublisher.ManagedByLabel] = rootpublisher.ManagedByValue
	if _, err := client.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	c.metrics.bundle.WithLabelValues("update").Inc()
	c.log.Info("updated the ClusterTrustBundle", logs.KeyBundle, t.name, logs.KeyChanged, !bytes.Equal([]byte(cur.Spec.TrustBundle), want))
	return nil
}
