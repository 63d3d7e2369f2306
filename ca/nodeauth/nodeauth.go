package nodeauth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/logs"
)

// DefaultLookupTimeout bounds one direct read of the API server, made only
// while the pod informer has not synced.
const DefaultLookupTimeout = 5 * time.Second

// Results of an authorization, the values of the result label of
// meshid_ca_impersonations_total.
const (
	ResultAllowed         = "allowed"
	ResultUntrustedCaller = "untrusted_caller" // condition 1
	ResultUnboundCaller   = "unbound_caller"   // condition 2
	ResultNoPodOnNode     = "no_pod_on_node"   // condition 3
	ResultForeignIdentity = "foreign_identity" // condition 4
	ResultUnavailable     = "unavailable"      // pods could not be read
)

var results = []string{ResultAllowed, ResultUntrustedCaller, ResultUnboundCaller, ResultNoPodOnNode, ResultForeignIdentity, ResultUnavailable}

// Config configures an Authorizer.
type Config struct {
	// TrustedAccounts are the node agents' service accounts that may
	// impersonate the pods on their node (--trusted-node-accounts, Istio's
	// CA_TRUSTED_NODE_ACCOUNTS, e.g. istio-system/ztunnel). Required: an
	// Authorizer with none would refuse everything; leave node mode off
	// instead.
	TrustedAccounts []identity.ServiceAccount
	// Client reads pods: the informer's list and watch, and direct reads
	// until the informer has synced. It needs get, list and watch on pods
	// in every namespace. Required.
	Client kubeclient.Interface
	// TrustDomain is the CA's trust domain; an impersonated identity in
	// any other is refused. Required.
	TrustDomain spiffeid.TrustDomain
	// LookupTimeout bounds a direct read of the API server. Default 5s.
	LookupTimeout time.Duration
	Logger        *slog.Logger          // nil discards logs
	Registerer    prometheus.Registerer // nil registers no metrics
}

// Authorizer decides whether a node agent may impersonate a workload. Its
// pod informer starts with Run; Authorize is safe for concurrent use.
type Authorizer struct {
	trusted  map[identity.ServiceAccount]bool
	td       spiffeid.TrustDomain
	client   kubeclient.Interface
	timeout  time.Duration
	log      *slog.Logger
	factory  *kubeclient.InformerFactory
	informer cache.SharedIndexInformer
	counts   map[string]prometheus.Counter
}

// New validates cfg and builds the pod informer; it starts nothing (Run
// does).
func New(cfg Config) (*Authorizer, error) {
	if len(cfg.TrustedAccounts) == 0 {
		return nil, errors.New("nodeauth: at least one trusted node account is required")
	}
	if cfg.Client == nil {
		return nil, errors.New("nodeauth: Config.Client is required: node authorization must see pods")
	}
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("nodeauth: Config.TrustDomain is required")
	}
	if cfg.LookupTimeout < 0 {
		return nil, fmt.Errorf("nodeauth: negative lookup timeout %s", cfg.LookupTimeout)
	}
	cfg.LookupTimeout = cmp.Or(cfg.LookupTimeout, DefaultLookupTimeout)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	trusted := make(map[identity.ServiceAccount]bool, len(cfg.TrustedAccounts))
	for _, sa := range cfg.TrustedAccounts {
		if _, err := sa.ID(cfg.TrustDomain); err != nil {
			return nil, fmt.Errorf("nodeauth: trusted node account %q: %w", sa, err)
		}
		trusted[sa] = true
	}
	factory := kubeclient.NewInformerFactory(cfg.Client, 0, kubeclient.WithTransform(slimPod))
	inf := factory.Pods().Informer()
	if err := inf.AddIndexers(cache.Indexers{indexNodeAccount: nodeAccountIndex}); err != nil {
		return nil, fmt.Errorf("nodeauth: pod index: %w", err)
	}
	a := &Authorizer{
		trusted:  trusted,
		td:       cfg.TrustDomain,
		client:   cfg.Client,
		timeout:  cfg.LookupTimeout,
		log:      cfg.Logger,
		factory:  factory,
		informer: inf,
		counts:   map[string]prometheus.Counter{},
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshid_ca_impersonations_total",
		Help: "Requests of node agents to impersonate a workload (ImpersonatedIdentity), by result: allowed, untrusted_caller, unbound_caller, no_pod_on_node, foreign_identity, unavailable.",
	}, []string{"result"})
	for _, r := range results {
		a.counts[r] = vec.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(vec); err != nil {
			return nil, fmt.Errorf("nodeauth: register metrics: %w", err)
		}
	}
	return a, nil
}

// Run runs the pod informer until ctx ends.
func (a *Authorizer) Run(ctx context.Context) error {
	a.factory.Start(ctx.Done())
	defer a.factory.Shutdown()
	if cache.WaitForCacheSync(ctx.Done(), a.informer.HasSynced) {
		a.log.Info("node authorization: pod informer synced", logs.KeyPods, len(a.informer.GetStore().ListKeys()))
	}
	<-ctx.Done()
	return nil
}

// HasSynced reports whether the pod informer has listed every pod once.
func (a *Authorizer) HasSynced() bool { return a.informer.HasSynced() }

// Authorize returns nil when caller may have a certificate for
// impersonated (conditions 1 to 4 of the package documentation), a
// PermissionDenied *ca.Error naming the condition that failed, or an
// Unavailable one when pods could not be read.
// A nil Authorizer refuses every impersonation: node mode is off.
func (a *Authorizer) Authorize(ctx context.Context, caller *authn.Caller, impersonated spiffeid.ID) error {
	if a == nil {
		return ca.Errorf(ca.KindPermissionDenied, "impersonation is off on this CA: no trusted node accounts are configured")
	}
	result, err := a.authorize(ctx, caller, impersonated)
	a.counts[result].Inc()
	return err
}

func denied(format string, args ...any) error {
	return ca.Errorf(ca.KindPermissionDenied, "impersonation refused: "+format, args...)
}

func (a *Authorizer) authorize(ctx context.Context, caller *authn.Caller, id spiffeid.ID) (string, error) {
	if caller == nil {
		return ResultUntrustedCaller, denied("condition 1 (trusted node account): no authenticated caller")
	}
	// Condition 1 first: a caller that is not a node agent learns nothing
	// about pods or nodes from the answer.
	if caller.Method != authn.MethodTokenReview && caller.Method != authn.MethodJWT {
		return ResultUntrustedCaller, denied("condition 1 (trusted node account): only a Kubernetes service-account token can impersonate, the caller authenticated with %s", caller.Method)
	}
	if !a.trusted[caller.Account()] {
		return ResultUntrustedCaller, denied("condition 1 (trusted node account): %s is not a trusted node account", caller.Account())
	}
	// Condition 4 next: it needs no pod.
	if id.TrustDomain() != a.td {
		return ResultForeignIdentity, denied("condition 4 (identity): %s is not in this CA's trust domain %s", id, a.td.Name())
	}
	sa, err := identity.FromID(id)
	if err != nil {
		return ResultForeignIdentity, denied("condition 4 (identity): %s is not a workload identity spiffe://%s/ns/<namespace>/sa/<service-account>", id, a.td.Name())
	}
	if caller.PodName == "" || caller.PodUID == "" {
		return ResultUnboundCaller, denied("condition 2 (caller's pod): the token of %s is not bound to a pod", caller.Account())
	}
	node, result, err := a.callerNode(ctx, caller)
	if err != nil {
		return result, err
	}
	found, err := a.podOnNode(ctx, node, sa)
	if err != nil {
		return ResultUnavailable, err
	}
	if !found {
		return ResultNoPodOnNode, denied("condition 3 (pod on the node): no running pod of %s is scheduled on node %s", sa, node)
	}
	return ResultAllowed, nil
}

// callerNode returns the node of the pod the caller's token is bound to,
// after checking that the pod still exists with the token's UID and is not
// terminated. A node named by the token must agree with the pod's.
func (a *Authorizer) callerNode(ctx context.Context, caller *authn.Caller) (string, string, error) {
	pod, err := a.pod(ctx, caller.Namespace, caller.PodName)
	if err != nil {
		return "", ResultUnavailable, err
	}
	switch {
	case pod == nil:
		return "", ResultUnboundCaller, denied("condition 2 (caller's pod): the caller's pod %s/%s does not exist", caller.Namespace, caller.PodName)
	case string(pod.UID) != caller.PodUID:
		return "", ResultUnboundCaller, denied("condition 2 (caller's pod): the caller's pod %s/%s is not the one its token is bound to (UID differs)", caller.Namespace, caller.PodName)
	case pod.terminated():
		return "", ResultUnboundCaller, denied("condition 2 (caller's pod): the caller's pod %s/%s has terminated", caller.Namespace, caller.PodName)
	case pod.Node == "":
		return "", ResultUnboundCaller, denied("condition 2 (caller's pod): the caller's pod %s/%s is not scheduled on a node", caller.Namespace, caller.PodName)
	case caller.NodeName != "" && caller.NodeName != pod.Node:
		return "", ResultUnboundCaller, denied("condition 2 (caller's pod): the token names node %s but the caller's pod is on node %s", caller.NodeName, pod.Node)
	case pod.ServiceAccount != caller.ServiceAccount:
		return "", ResultUnboundCaller, denied("condition 2 (caller's pod): the caller's pod %s/%s runs as another service account", caller.Namespace, caller.PodName)
	}
	return pod.Node, "", nil
}

// pod returns the pod ns/name, or nil when it does not exist: from the
// informer once it has synced, else from the API server.
func (a *Authorizer) pod(ctx context.Context, ns, name string) (*podInfo, error) {
	if a.informer.HasSynced() {
		obj, ok, err := a.informer.GetStore().GetByKey(ns + "/" + name)
		if err != nil || !ok {
			return nil, err
		}
		return obj.(*podInfo), nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	pod, err := a.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		a.log.Warn("node authorization: cannot read a pod before the informer synced", logs.KeyPod, ns+"/"+name, logs.KeyError, err)
		return nil, ca.Wrap(ca.KindUnavailable, err, "impersonation: the pod informer has not synced and the Kubernetes API server cannot answer; retry later")
	}
	return infoOf(pod), nil
}

// podOnNode reports whether a pod of sa that has not terminated is
// scheduled on node: from the informer's index once it has synced, else
// by listing the namespace's pods on that node from the API server.
func (a *Authorizer) podOnNode(ctx context.Context, node string, sa identity.ServiceAccount) (bool, error) {
	if a.informer.HasSynced() {
		objs, err := a.informer.GetIndexer().ByIndex(indexNodeAccount, nodeAccountKey(node, sa.Namespace, sa.Name))
		if err != nil {
			return false, ca.Wrap(ca.KindInternal, err, "impersonation: pod index")
		}
		for _, o := range objs {
			if !o.(*podInfo).terminated() {
				return true, nil
			}
		}
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	list, err := a.client.CoreV1().Pods(sa.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		a.log.Warn("node authorization: cannot list pods before the informer synced", logs.KeyNamespace, sa.Namespace, logs.KeyNode, node, logs.KeyError, err)
		return false, ca.Wrap(ca.KindUnavailable, err, "impersonation: the pod informer has not synced and the Kubernetes API server cannot answer; retry later")
	}
	for i := range list.Items {
		p := infoOf(&list.Items[i])
		if p.Node == node && p.ServiceAccount == sa.Name && !p.terminated() {
			return true, nil
		}
	}
	return false, nil
}
