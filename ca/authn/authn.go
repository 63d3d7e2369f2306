package authn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/identity"
)

// Credentials are what a request presented. Token is the bearer token
// without the "Bearer " prefix; PeerCertificates is the verified client
// certificate chain, leaf first, when the TLS handshake carried one.
type Credentials struct {
	Token            string
	PeerCertificates []*x509.Certificate
	// ClusterID is the cluster the caller says its token comes from (the
	// ClusterID request metadata, Istio's ISTIO_META_CLUSTER_ID); empty
	// means the CA's own cluster. ca/cluster routes the token by it.
	ClusterID string
}

// Caller is a proven workload identity.
type Caller struct {
	Namespace      string
	ServiceAccount string
	PodName        string // empty when the credential is not bound to a pod
	PodUID         string
	// NodeName is the node of the pod the token is bound to, when the
	// credential says so: the TokenReview extra
	// authentication.kubernetes.io/node-name or the verified JWT's
	// kubernetes.io node claim. Empty when unknown; node authorization
	// (ca/nodeauth) then reads the node from the pod object.
	NodeName string
	Method   string    // the authenticator's kind: MethodTokenReview, MethodJWT or MethodClientCert
	Expiry   time.Time // when the credential stops being valid; zero if unknown
	// Certificate is the verified client certificate the caller renewed
	// with (Method "clientcert"); nil for a token. A leaf issued on its
	// strength must not outlive it (ca.Request.Renewal).
	Certificate *x509.Certificate
	// Cluster is the remote cluster whose API server proved the caller
	// (ca/cluster); empty for the CA's own cluster. Node authorization
	// reads that cluster's pods.
	Cluster string
}

// Authentication methods, the values of Caller.Method.
const (
	MethodTokenReview = "tokenreview" // a token the Kubernetes API server reviewed
	MethodJWT         = "jwt"         // a token verified offline against a key set
	MethodClientCert  = "clientcert"  // a client certificate this CA issued
)

// Account returns the caller's service account.
func (c *Caller) Account() identity.ServiceAccount {
	return identity.ServiceAccount{Namespace: c.Namespace, Name: c.ServiceAccount}
}

// ID returns the caller's SPIFFE ID in trust domain td:
// spiffe://<td>/ns/<namespace>/sa/<service-account>.
func (c *Caller) ID(td spiffeid.TrustDomain) (spiffeid.ID, error) {
	id, err := c.Account().ID(td)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("authn: caller: %w", err)
	}
	return id, nil
}

// String names the caller for logs: "ns/sa (method)", or "ns/sa
// (method, cluster ID)" for a caller of a remote cluster.
func (c *Caller) String() string {
	if c.Cluster != "" {
		return c.Namespace + "/" + c.ServiceAccount + " (" + c.Method + ", cluster " + c.Cluster + ")"
	}
	return c.Namespace + "/" + c.ServiceAccount + " (" + c.Method + ")"
}

// Authenticator verifies credentials. It returns ErrNoCredentials when the
// request carries nothing it understands (so that the next authenticator is
// tried), a *ca.Error of kind Unauthenticated when the credential is bad, or
// of kind Unavailable when it could not decide (an API server is down).
type Authenticator interface {
	Authenticate(ctx context.Context, creds Credentials) (*Caller, error)
}

// MaxTokenSize is the largest bearer token accepted: 16 KiB. A Kubernetes
// service-account token is about 1 KiB; a larger one is refused before it
// is hashed, parsed or sent to the API server.
const MaxTokenSize = 16 << 10

// CheckTokenSize returns an Unauthenticated error when token is longer
// than max bytes.
func CheckTokenSize(token string, max int) error {
	if len(token) > max {
		return ca.Errorf(ca.KindUnauthenticated, "authn: the token is %d bytes, more than the %d KiB limit", len(token), max>>10)
	}
	return nil
}

// ErrNoCredentials means the authenticator found no credential of its kind.
var ErrNoCredentials = errors.New("authn: no credentials of this kind")
