package kubeclient

import (
	"context"
	"fmt"
	"net/http"
	"reflect"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Interface is the subset of client-go's kubernetes.Interface meshid uses.
type Interface interface {
	CoreV1() CoreV1Interface
	AuthenticationV1() AuthenticationV1Interface
	CoordinationV1() CoordinationV1Interface
	CertificatesV1() CertificatesV1Interface
}

// CoreV1Interface has the core/v1 resources meshid uses.
type CoreV1Interface interface {
	RESTClient() rest.Interface
	ConfigMaps(namespace string) ConfigMapInterface
	Namespaces() NamespaceInterface
	Nodes() NodeInterface
	Pods(namespace string) PodInterface
	Secrets(namespace string) SecretInterface
	ServiceAccounts(namespace string) ServiceAccountInterface
}

// AuthenticationV1Interface has TokenReviews.
type AuthenticationV1Interface interface {
	RESTClient() rest.Interface
	TokenReviews() TokenReviewInterface
}

// CoordinationV1Interface has Leases.
type CoordinationV1Interface interface {
	RESTClient() rest.Interface
	Leases(namespace string) LeaseInterface
}

// CertificatesV1Interface has PodCertificateRequests and
// ClusterTrustBundles (the pod certificate signer's resources).
type CertificatesV1Interface interface {
	RESTClient() rest.Interface
	PodCertificateRequests(namespace string) PodCertificateRequestInterface
	ClusterTrustBundles() ClusterTrustBundleInterface
}

// Resource is the method set of client-go's generated typed clients (less
// Apply) for a resource of type T listed as L: what gentype.ClientWithList
// and gentype.FakeClientWithList implement.
type Resource[T runtime.Object, L runtime.Object] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	DeleteCollection(ctx context.Context, opts metav1.DeleteOptions, listOpts metav1.ListOptions) error
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

// The typed clients, named as client-go names them.
type (
	ConfigMapInterface      = Resource[*corev1.ConfigMap, *corev1.ConfigMapList]
	NamespaceInterface      = Resource[*corev1.Namespace, *corev1.NamespaceList]
	NodeInterface           = Resource[*corev1.Node, *corev1.NodeList]
	PodInterface            = Resource[*corev1.Pod, *corev1.PodList]
	SecretInterface         = Resource[*corev1.Secret, *corev1.SecretList]
	ServiceAccountInterface = Resource[*corev1.ServiceAccount, *corev1.ServiceAccountList]
	LeaseInterface          = Resource[*coordinationv1.Lease, *coordinationv1.LeaseList]

	PodCertificateRequestInterface = Resource[*certificatesv1.PodCertificateRequest, *certificatesv1.PodCertificateRequestList]
	ClusterTrustBundleInterface    = Resource[*certificatesv1.ClusterTrustBundle, *certificatesv1.ClusterTrustBundleList]
)

// TokenReviewInterface creates TokenReviews (the API has no other verb).
type TokenReviewInterface interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// Clientset is the real Interface, talking to an API server.
type Clientset struct {
	core  *coreV1
	authn *authenticationV1
	coord *coordinationV1
	certs *certificatesV1
}

var _ Interface = (*Clientset)(nil)

// New returns a Clientset for the API server of cfg, as client-go's
// kubernetes.NewForConfig does: one HTTP client and, unless cfg has its own
// RateLimiter, one token bucket of cfg.QPS and cfg.Burst shared by the
// groups. It makes no request.
func New(cfg *rest.Config) (*Clientset, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: %w", err)
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("kubeclient: burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	core, err := restClient(&c, httpClient, corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	authn, err := restClient(&c, httpClient, authenticationv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	coord, err := restClient(&c, httpClient, coordinationv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	certs, err := restClient(&c, httpClient, certificatesv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &Clientset{core: &coreV1{core}, authn: &authenticationV1{authn}, coord: &coordinationV1{coord}, certs: &certificatesV1{certs}}, nil
}

// restClient is a group's REST client, configured as client-go's generated
// setConfigDefaults does.
func restClient(cfg *rest.Config, h *http.Client, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	c := *cfg
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, Codecs).WithoutConversion()
	rc, err := rest.RESTClientForConfigAndClient(&c, h)
	if err != nil {
		return nil, fmt.Errorf("kubeclient: %s client: %w", gv, err)
	}
	return rc, nil
}

// CoreV1 returns the core/v1 client.
func (c *Clientset) CoreV1() CoreV1Interface { return c.core }

// AuthenticationV1 returns the authentication.k8s.io/v1 client.
func (c *Clientset) AuthenticationV1() AuthenticationV1Interface { return c.authn }

// CoordinationV1 returns the coordination.k8s.io/v1 client.
func (c *Clientset) CoordinationV1() CoordinationV1Interface { return c.coord }

// CertificatesV1 returns the certificates.k8s.io/v1 client.
func (c *Clientset) CertificatesV1() CertificatesV1Interface { return c.certs }

// typed is a gentype client of resource in namespace, preferring protobuf
// as client-go's generated clients of built-in types do.
func typed[T interface {
	runtime.Object
	metav1.Object
}, L runtime.Object](rc rest.Interface, resource, namespace string) *gentype.ClientWithList[T, L] {
	return gentype.NewClientWithList[T, L](resource, rc, ParameterCodec, namespace,
		func() T { return newObject[T]() }, func() L { return newObject[L]() }, gentype.PrefersProtobuf[T]())
}

// newObject returns a new zero *X for T = *X (what the generated clients'
// func() *X { return &X{} } does, once for every type).
func newObject[T runtime.Object]() T {
	return reflect.New(reflect.TypeFor[T]().Elem()).Interface().(T)
}

type coreV1 struct{ rc rest.Interface }

func (c *coreV1) RESTClient() rest.Interface { return c.rc }
func (c *coreV1) ConfigMaps(ns string) ConfigMapInterface {
	return typed[*corev1.ConfigMap, *corev1.ConfigMapList](c.rc, "configmaps", ns)
}
func (c *coreV1) Namespaces() NamespaceInterface {
	return typed[*corev1.Namespace, *corev1.NamespaceList](c.rc, "namespaces", "")
}
func (c *coreV1) Nodes() NodeInterface {
	return typed[*corev1.Node, *corev1.NodeList](c.rc, "nodes", "")
}
func (c *coreV1) Pods(ns string) PodInterface {
	return typed[*corev1.Pod, *corev1.PodList](c.rc, "pods", ns)
}
func (c *coreV1) Secrets(ns string) SecretInterface {
	return typed[*corev1.Secret, *corev1.SecretList](c.rc, "secrets", ns)
}
func (c *coreV1) ServiceAccounts(ns string) ServiceAccountInterface {
	return typed[*corev1.ServiceAccount, *corev1.ServiceAccountList](c.rc, "serviceaccounts", ns)
}

type authenticationV1 struct{ rc rest.Interface }

func (c *authenticationV1) RESTClient() rest.Interface { return c.rc }
func (c *authenticationV1) TokenReviews() TokenReviewInterface {
	return gentype.NewClient[*authenticationv1.TokenReview]("tokenreviews", c.rc, ParameterCodec, "",
		func() *authenticationv1.TokenReview { return &authenticationv1.TokenReview{} },
		gentype.PrefersProtobuf[*authenticationv1.TokenReview]())
}

type coordinationV1 struct{ rc rest.Interface }

func (c *coordinationV1) RESTClient() rest.Interface { return c.rc }
func (c *coordinationV1) Leases(ns string) LeaseInterface {
	return typed[*coordinationv1.Lease, *coordinationv1.LeaseList](c.rc, "leases", ns)
}

type certificatesV1 struct{ rc rest.Interface }

func (c *certificatesV1) RESTClient() rest.Interface { return c.rc }
func (c *certificatesV1) PodCertificateRequests(ns string) PodCertificateRequestInterface {
	return typed[*certificatesv1.PodCertificateRequest, *certificatesv1.PodCertificateRequestList](c.rc, "podcertificaterequests", ns)
}
func (c *certificatesV1) ClusterTrustBundles() ClusterTrustBundleInterface {
	return typed[*certificatesv1.ClusterTrustBundle, *certificatesv1.ClusterTrustBundleList](c.rc, "clustertrustbundles", "")
}
