package podcert

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/internal/logs"
)

// run is the leader's signer: its queue, caches and lister.
type run struct {
	queue   workqueue.TypedRateLimitingInterface[string]
	pcrs    certlisters.PodCertificateRequestLister
	objects *objects
}

// sign runs the signer until ctx ends.
func (c *Controller) sign(ctx context.Context) error {
	factory := kubeclient.NewInformerFactory(c.cfg.Client, 0,
		kubeclient.WithTweakListOptions(func(o *metav1.ListOptions) {
			// Only this signer's requests are listed and watched.
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", c.cfg.SignerName).String()
		}),
		kubeclient.WithTransform(slimRequest))
	inf := factory.PodCertificateRequests()
	r := &run{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "podcertificaterequests"}),
		pcrs:    inf.Lister(),
		objects: newObjects(c),
	}
	defer r.queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	_, err := inf.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: c.pending,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
		},
	})
	if err != nil {
		return fmt.Errorf("podcert: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// The object caches first: a request is never judged against a cache
	// that has not synced (a miss is read live anyway).
	if !r.objects.start(ctx, &wg) {
		return nil
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil
	}
	c.mu.Lock()
	c.leading = r
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.leading = nil
		c.mu.Unlock()
	}()
	c.log.Info("signing pod certificate requests", logs.KeyWorkers, c.cfg.Workers)
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx, r) {
			}
		})
	}
	<-ctx.Done()
	r.queue.ShutDown()
	return nil
}

// pending filters events to this signer's requests without an answer (a
// fake client, or an old server, may ignore the field selector).
func (c *Controller) pending(obj any) bool {
	pcr, ok := obj.(*certificatesv1.PodCertificateRequest)
	return ok && pcr.Spec.SignerName == c.cfg.SignerName && !terminal(pcr)
}

// slimRequest drops the managed fields of a request before it is cached,
// and the chain of an answered one (only its conditions are read).
func slimRequest(obj any) (any, error) {
	pcr, ok := obj.(*certificatesv1.PodCertificateRequest)
	if !ok {
		return obj, nil
	}
	pcr.ManagedFields = nil
	if terminal(pcr) {
		pcr.Spec.StubPKCS10Request = nil
		pcr.Status.CertificateChain = ""
	}
	return pcr, nil
}

func (c *Controller) processNext(ctx context.Context, r *run) bool {
	key, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(key)
	retry, err := c.process(ctx, r, key)
	switch {
	case ctx.Err() != nil:
	case retry != "" && (retry == "unavailable" || retry == "conflict" || retry == "api_error" || r.queue.NumRequeues(key) < c.cfg.MaxRetries):
		c.metrics.retries.WithLabelValues(retry).Inc()
		c.log.Debug("pod certificate request retried", logs.KeyRequest, key, logs.KeyWhy, retry, logs.KeyError, err)
		r.queue.AddRateLimited(key)
	case retry != "":
		// Out of attempts at a failure that did not pass.
		c.fail(ctx, r, key, reasonSigningFailed, err)
		r.queue.Forget(key)
	default:
		r.queue.Forget(key)
	}
	return true
}

// process answers the request key. It returns the reason to retry ("" for
// done) and the error behind it.
func (c *Controller) process(ctx context.Context, r *run, key string) (string, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return "", nil
	}
	pcr, err := r.pcrs.PodCertificateRequests(ns).Get(name)
	if apierrors.IsNotFound(err) || (err == nil && !c.pending(pcr)) {
		return "", nil // gone, answered, or not ours
	}
	if err != nil {
		return "api_error", err
	}
	ok, err := c.judge(ctx, r.objects, pcr)
	if d := (*denial)(nil); errors.As(err, &d) {
		return c.answer(ctx, pcr, resultDenied, certificatesv1.PodCertificateRequestStatus{
			Conditions: []metav1.Condition{condition(pcr, certificatesv1.PodCertificateRequestConditionTypeDenied, d.reason, d.message, c.clock.Now())},
		}, d.reason, nil)
	}
	if err != nil {
		return "api_error", err
	}
	iss, err := c.cfg.Signer.Sign(ctx, ca.Request{
		CSR:    ok.csr,
		ID:     ok.id,
		Caller: fmt.Sprintf("podcertificaterequest %s/%s pod %s node %s", pcr.Namespace, pcr.Name, pcr.Spec.PodName, pcr.Spec.NodeName),
		TTL:    c.ttl(pcr, c.clock.Now()),
	})
	switch {
	case err == nil:
	case ca.KindOf(err) == ca.KindUnavailable || ca.KindOf(err) == ca.KindResourceExhausted:
		return "unavailable", err
	case ca.KindOf(err) == ca.KindInternal:
		return "internal", err
	default: // the policy refused it: asking again changes nothing
		return c.answer(ctx, pcr, resultFailed, failedStatus(pcr, reasonSigningRefused, err.Error(), c.clock.Now()), reasonSigningRefused, nil)
	}
	if err := checkLifetime(pcr, iss.Leaf); err != nil {
		return "lifetime", err // a CA younger than the backdating, or about to expire
	}
	return c.answer(ctx, pcr, resultIssued, c.issuedStatus(pcr, iss, c.clock.Now()), reasonIssued, iss)
}

// failedStatus is a Failed answer.
func failedStatus(pcr *certificatesv1.PodCertificateRequest, reason, message string, now time.Time) certificatesv1.PodCertificateRequestStatus {
	return certificatesv1.PodCertificateRequestStatus{
		Conditions: []metav1.Condition{condition(pcr, certificatesv1.PodCertificateRequestConditionTypeFailed, reason, truncateMessage(message), now)},
	}
}

// fail writes a Failed answer for key after its retries ran out.
func (c *Controller) fail(ctx context.Context, r *run, key, reason string, cause error) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	pcr, err := r.pcrs.PodCertificateRequests(ns).Get(name)
	if err != nil || !c.pending(pcr) {
		return
	}
	msg := "signing failed"
	if cause != nil {
		msg = cause.Error()
	}
	if _, err := c.answer(ctx, pcr, resultFailed, failedStatus(pcr, reason, msg, c.clock.Now()), reason, nil); err != nil {
		c.log.Warn("cannot mark the pod certificate request Failed", logs.KeyRequest, key, logs.KeyError, err)
	}
}

// answer writes status to pcr, once: a conflict means another writer or a
// stale cache, and the request is judged again from the cache. It counts
// and logs the answer (the audit line of a denied or failed request).
func (c *Controller) answer(ctx context.Context, pcr *certificatesv1.PodCertificateRequest, result string, status certificatesv1.PodCertificateRequestStatus, reason string, iss *ca.Issued) (string, error) {
	upd := pcr.DeepCopy()
	upd.Status = status
	_, err := c.cfg.Client.CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err):
		return "conflict", err
	case apierrors.IsNotFound(err):
		return "", nil // deleted meanwhile
	case err != nil:
		return "api_error", err
	}
	now := c.clock.Now()
	c.metrics.requests.WithLabelValues(result, reason).Inc()
	attrs := []slog.Attr{
		slog.String(logs.KeyRequest, pcr.Namespace+"/"+pcr.Name),
		slog.String(logs.KeyNamespace, pcr.Namespace),
		slog.String(logs.KeyPod, pcr.Spec.PodName),
		slog.String(logs.KeyNode, string(pcr.Spec.NodeName)),
		slog.String(logs.KeyReason, reason),
	}
	if iss != nil {
		c.metrics.latency.Observe(now.Sub(pcr.CreationTimestamp.Time).Seconds())
		attrs = append(attrs,
			slog.String(logs.KeySPIFFEID, iss.Leaf.URIs[0].String()),
			slog.String(logs.KeySerial, iss.Leaf.SerialNumber.Text(16)),
			slog.Time(logs.KeyNotAfter, iss.Leaf.NotAfter))
		// The audit line is the Authority's ("certificate issued": serial,
		// identity, not_after, and the request, pod and node as caller).
		c.log.LogAttrs(ctx, slog.LevelDebug, "pod certificate issued", attrs...)
		return "", nil
	}
	attrs = append(attrs, slog.String(logs.KeyMessage, status.Conditions[0].Message))
	c.log.LogAttrs(ctx, slog.LevelInfo, "pod certificate request "+result, attrs...)
	return "", nil
}

// maxMessage bounds a condition's message (the API allows 32 KiB).
const maxMessage = 1024

func truncateMessage(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage] + "…"
}
