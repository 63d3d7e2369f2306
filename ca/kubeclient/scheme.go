package kubeclient

import (
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// Scheme holds the API groups this client speaks, and only those: core/v1,
// authentication/v1, coordination/v1 and certificates/v1 (client-go's kubernetes/scheme has
// all of them).
var Scheme = runtime.NewScheme()

// Codecs and ParameterCodec encode and decode with Scheme.
var (
	Codecs         = serializer.NewCodecFactory(Scheme)
	ParameterCodec = runtime.NewParameterCodec(Scheme)
)

var schemeBuilder = runtime.NewSchemeBuilder(
	corev1.AddToScheme,
	authenticationv1.AddToScheme,
	coordinationv1.AddToScheme,
	certificatesv1.AddToScheme,
)

// AddToScheme adds the groups of Scheme to s.
var AddToScheme = schemeBuilder.AddToScheme

func init() {
	// The unversioned meta types (ListOptions, Status, ...) as in
	// client-go's kubernetes/scheme.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(AddToScheme(Scheme))
}
