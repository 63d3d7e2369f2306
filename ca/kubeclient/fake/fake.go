// Package fake is a kubeclient.Interface for unit tests, the equivalent of
// client-go's kubernetes/fake over kubeclient's narrow scheme: client-go's
// object tracker serves the objects, and the embedded testing.Fake records
// actions and takes reactors (PrependReactor, Actions). Real API server
// tests use kubeclient.New against test/kube's harness.
package fake

import (
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca/kubeclient"
)

// Clientset is the fake kubeclient.Interface.
type Clientset struct {
	testing.Fake
	tracker testing.ObjectTracker
}

var (
	_ kubeclient.Interface = (*Clientset)(nil)
	_ testing.FakeClient   = (*Clientset)(nil)
)

// NewClientset returns a Clientset serving objects, as client-go's
// fake.NewSimpleClientset does (no server-side apply: meshid does not use
// it). It panics on an object the scheme does not know, as client-go's does.
func NewClientset(objects ...runtime.Object) *Clientset {
	o := testing.NewObjectTracker(kubeclient.Scheme, kubeclient.Codecs.UniversalDecoder())
	for _, obj := range objects {
		if err := o.Add(obj); err != nil {
			panic(err)
		}
	}
	cs := &Clientset{tracker: o}
	cs.AddReactor("*", "*", testing.ObjectReaction(o))
	cs.AddWatchReactor("*", func(action testing.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(testing.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := o.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, w, nil
	})
	return cs
}

// Tracker returns the object tracker.
func (c *Clientset) Tracker() testing.ObjectTracker { return c.tracker }

// IsWatchListSemanticsUnSupported tells client-go's reflector to list then
// watch: the tracker does not stream lists (as client-go's fake says).
func (c *Clientset) IsWatchListSemanticsUnSupported() bool { return true }

// CoreV1 returns the fake core/v1 client.
func (c *Clientset) CoreV1() kubeclient.CoreV1Interface { return &coreV1{&c.Fake} }

// AuthenticationV1 returns the fake authentication/v1 client.
func (c *Clientset) AuthenticationV1() kubeclient.AuthenticationV1Interface {
	return &authenticationV1{&c.Fake}
}

// CoordinationV1 returns the fake coordination/v1 client.
func (c *Clientset) CoordinationV1() kubeclient.CoordinationV1Interface {
	return &coordinationV1{&c.Fake}
}

// CertificatesV1 returns the fake certificates.k8s.io/v1 client.
func (c *Clientset) CertificatesV1() kubeclient.CertificatesV1Interface {
	return &certificatesV1{&c.Fake}
}

// listed is a list type with items of T = *X.
type listed[X any, L any] interface {
	*L
	runtime.Object
	metav1.ListInterface
}

// typed is a gentype fake of resource in namespace; items reads and
// writes L's Items.
func typed[X any, T interface {
	*X
	runtime.Object
	metav1.Object
}, L any, PL listed[X, L]](fake *testing.Fake, gv schema.GroupVersion, resource, kind, namespace string, items func(PL) *[]X) *gentype.FakeClientWithList[T, PL] {
	return gentype.NewFakeClientWithList[T, PL](fake, namespace, gv.WithResource(resource), gv.WithKind(kind),
		func() T { return T(new(X)) },
		func() PL { return PL(new(L)) },
		func(dst, src PL) {
			dst.SetResourceVersion(src.GetResourceVersion())
			dst.SetContinue(src.GetContinue())
			dst.SetRemainingItemCount(src.GetRemainingItemCount())
			dst.SetSelfLink(src.GetSelfLink())
		},
		func(l PL) []T { return toPointers[X, T](*items(l)) },
		func(l PL, ts []T) { *items(l) = fromPointers[X, T](ts) })
}

func toPointers[X any, T interface{ *X }](xs []X) []T {
	out := make([]T, len(xs))
	for i := range xs {
		out[i] = &xs[i]
	}
	return out
}

func fromPointers[X any, T interface{ *X }](ts []T) []X {
	out := make([]X, len(ts))
	for i, t := range ts {
		out[i] = *t
	}
	return out
}

type coreV1 struct{ fake *testing.Fake }

// RESTClient is nil, as in client-go's fake.
func (c *coreV1) RESTClient() rest.Interface { var r *rest.RESTClient; return r }

func (c *coreV1) ConfigMaps(ns string) kubeclient.ConfigMapInterface {
	return typed[corev1.ConfigMap, *corev1.ConfigMap](c.fake, corev1.SchemeGroupVersion, "configmaps", "ConfigMap", ns,
		func(l *corev1.ConfigMapList) *[]corev1.ConfigMap { return &l.Items })
}

func (c *coreV1) Namespaces() kubeclient.NamespaceInterface {
	return typed[corev1.Namespace, *corev1.Namespace](c.fake, corev1.SchemeGroupVersion, "namespaces", "Namespace", "",
		func(l *corev1.NamespaceList) *[]corev1.Namespace { return &l.Items })
}

func (c *coreV1) Nodes() kubeclient.NodeInterface {
	return typed[corev1.Node, *corev1.Node](c.fake, corev1.SchemeGroupVersion, "nodes", "Node", "",
		func(l *corev1.NodeList) *[]corev1.Node { return &l.Items })
}

func (c *coreV1) Pods(ns string) kubeclient.PodInterface {
	return typed[corev1.Pod, *corev1.Pod](c.fake, corev1.SchemeGroupVersion, "pods", "Pod", ns,
		func(l *corev1.PodList) *[]corev1.Pod { return &l.Items })
}

func (c *coreV1) Secrets(ns string) kubeclient.SecretInterface {
	return typed[corev1.Secret, *corev1.Secret](c.fake, corev1.SchemeGroupVersion, "secrets", "Secret", ns,
		func(l *corev1.SecretList) *[]corev1.Secret { return &l.Items })
}

func (c *coreV1) ServiceAccounts(ns string) kubeclient.ServiceAccountInterface {
	return typed[corev1.ServiceAccount, *corev1.ServiceAccount](c.fake, corev1.SchemeGroupVersion, "serviceaccounts", "ServiceAccount", ns,
		func(l *corev1.ServiceAccountList) *[]corev1.ServiceAccount { return &l.Items })
}

type authenticationV1 struct{ fake *testing.Fake }

// RESTClient is nil, as in client-go's fake.
func (c *authenticationV1) RESTClient() rest.Interface { var r *rest.RESTClient; return r }

func (c *authenticationV1) TokenReviews() kubeclient.TokenReviewInterface {
	gv := authenticationv1.SchemeGroupVersion
	return gentype.NewFakeClient[*authenticationv1.TokenReview](c.fake, "", gv.WithResource("tokenreviews"), gv.WithKind("TokenReview"),
		func() *authenticationv1.TokenReview { return &authenticationv1.TokenReview{} })
}

type coordinationV1 struct{ fake *testing.Fake }

// RESTClient is nil, as in client-go's fake.
func (c *coordinationV1) RESTClient() rest.Interface { var r *rest.RESTClient; return r }

func (c *coordinationV1) Leases(ns string) kubeclient.LeaseInterface {
	return typed[coordinationv1.Lease, *coordinationv1.Lease](c.fake, coordinationv1.SchemeGroupVersion, "leases", "Lease", ns,
		func(l *coordinationv1.LeaseList) *[]coordinationv1.Lease { return &l.Items })
}

type certificatesV1 struct{ fake *testing.Fake }

// RESTClient is nil, as in client-go's fake.
func (c *certificatesV1) RESTClient() rest.Interface { var r *rest.RESTClient; return r }

func (c *certificatesV1) PodCertificateRequests(ns string) kubeclient.PodCertificateRequestInterface {
	return typed[certificatesv1.PodCertificateRequest, *certificatesv1.PodCertificateRequest](c.fake, certificatesv1.SchemeGroupVersion,
		"podcertificaterequests", "PodCertificateRequest", ns,
		func(l *certificatesv1.PodCertificateRequestList) *[]certificatesv1.PodCertificateRequest {
			return &l.Items
		})
}

func (c *certificatesV1) ClusterTrustBundles() kubeclient.ClusterTrustBundleInterface {
	return typed[certificatesv1.ClusterTrustBundle, *certificatesv1.ClusterTrustBundle](c.fake, certificatesv1.SchemeGroupVersion,
		"clustertrustbundles", "ClusterTrustBundle", "",
		func(l *certificatesv1.ClusterTrustBundleList) *[]certificatesv1.ClusterTrustBundle { return &l.Items })
}
