package harness

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnsureNamespace creates namespace ns unless it exists.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("harness: namespace %s: %w", ns, err)
	}
	return nil
}

// CreateServiceAccount creates namespace ns (if needed) and service
// account sa in it. There is no controller manager, so nothing else
// creates service accounts.
func (c *Cluster) CreateServiceAccount(ctx context.Context, ns, sa string) error {
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	_, err := c.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("harness: service account %s/%s: %w", ns, sa, err)
	}
	return nil
}

// CreatePod creates a pod running as service account sa. With no kubelet
// it stays Pending, which is all a bound token needs.
func (c *Cluster) CreatePod(ctx context.Context, ns, name, sa string) (*corev1.Pod, error) {
	return c.CreatePodOnNode(ctx, ns, name, sa, "")
}

// CreatePodOnNode is CreatePod with spec.nodeName set (when node is not
// ""), as the scheduler would: the pod's bound tokens then name the node.
func (c *Cluster) CreatePodOnNode(ctx context.Context, ns, name, sa, node string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	pod, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: pod %s/%s: %w", ns, name, err)
	}
	return pod, nil
}

// DeletePod deletes a pod at once (grace period 0; it was never scheduled).
func (c *Cluster) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	zero := int64(0)
	err := c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil {
		return fmt.Errorf("harness: delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// TokenSpec describes a TokenRequest.
type TokenSpec struct {
	Namespace      string
	ServiceAccount string
	Audiences      []string
	Pod            *corev1.Pod   // bind the token to this pod when set
	Expiration     time.Duration // 0 means 1h; the API server's minimum is 10m
}

// Token asks the API server for a service-account token (the TokenRequest
// API, what `kubectl create token` and the kubelet's projected volumes use).
func (c *Cluster) Token(ctx context.Context, spec TokenSpec) (string, error) {
	exp := spec.Expiration
	if exp == 0 {
		exp = time.Hour
	}
	secs := int64(exp / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         spec.Audiences,
		ExpirationSeconds: &secs,
	}}
	if spec.Pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: spec.Pod.Name, UID: spec.Pod.UID,
		}
	}
	resp, err := c.client.CoreV1().ServiceAccounts(spec.Namespace).CreateToken(ctx, spec.ServiceAccount, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("harness: token request for %s/%s: %w", spec.Namespace, spec.ServiceAccount, err)
	}
	return resp.Status.Token, nil
}

// Review runs a TokenReview as the admin, to check a test's precondition
// (what the API server itself says about a token).
func (c *Cluster) Review(ctx context.Context, token string, audiences []string) (authenticationv1.TokenReviewStatus, error) {
	tr, err := c.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.TokenReviewStatus{}, fmt.Errorf("harness: token review: %w", err)
	}
	return tr.Status, nil
}

// Claims decodes a JWT's payload without verifying it.
func Claims(token string) (map[string]any, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("harness: not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("harness: JWT payload: %w", err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, fmt.Errorf("harness: JWT payload: %w", err)
	}
	return claims, nil
}

// SignToken signs claims with the API server's own service-account key and
// key id, exactly as the API server signs tokens. Re-signing a real token's
// claims with a past "exp" gives an expired token that is otherwise genuine.
func (c *Cluster) SignToken(claims map[string]any) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(c.pki.saKey.Public())
	if err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	sum := sha256Sum(der)
	return SignJWT(jose.SigningKey{Algorithm: c.ServiceAccountAlgorithm(), Key: c.pki.saKey}, base64.RawURLEncoding.EncodeToString(sum[:]), claims)
}

// SignJWT signs claims with key, naming kid in the header unless it is
// empty: a token of any issuer, or a forgery with a chosen algorithm.
func SignJWT(key jose.SigningKey, kid string, claims map[string]any) (string, error) {
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	signer, err := jose.NewSigner(key, opts)
	if err != nil {
		return "", fmt.Errorf("harness: signer: %w", err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("harness: claims: %w", err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("harness: sign: %w", err)
	}
	return jws.CompactSerialize()
}
