package cluster

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/internal/logs"
)

// newRemote builds cluster id's TokenReview client and reviewer (with a
// review cache of its own) and, in node mode, its node authorization.
func (r *Router) newRemote(id string, rc *rest.Config) (*remote, error) {
	client, err := kubeclient.New(limited(rc, r.cfg.QPS, r.cfg.Burst, "tokenreview"))
	if err != nil {
		return nil, fmt.Errorf("TokenReview client: %w", err)
	}
	log := r.log.With(logs.KeyCluster, id)
	reviewer, err := authn.NewTokenReview(authn.TokenReviewConfig{
		Client:    client,
		Audiences: r.cfg.Audiences,
		Clock:     r.cfg.Clock,
		Logger:    log,
		// The Router counts reviews by cluster; the reviewer's own
		// metrics are the local cluster's.
	})
	if err != nil {
		return nil, err
	}
	rem := &remote{id: id, client: client, reviewer: reviewer}
	if len(r.cfg.TrustedNodeAccounts) == 0 {
		return rem, nil
	}
	pods, err := kubeclient.New(limited(rc, kubeclient.DefaultControllerQPS, kubeclient.DefaultControllerBurst, "controllers"))
	if err != nil {
		return nil, fmt.Errorf("pods client: %w", err)
	}
	rem.node, err = nodeauth.New(nodeauth.Config{
		TrustedAccounts: r.cfg.TrustedNodeAccounts,
		Client:          pods,
		TrustDomain:     r.cfg.TrustDomain,
		Logger:          log,
	})
	return rem, err
}

// limited returns a copy of rc with its own rate limit and a User-Agent
// that names the remote use.
func limited(rc *rest.Config, qps float32, burst int, use string) *rest.Config {
	c := rest.CopyConfig(rc)
	c.QPS, c.Burst = qps, burst
	c.RateLimiter = nil
	c.UserAgent = kubeclient.DefaultUserAgent + "/remote-" + use
	// A TokenReview's message names the API server's throttling (429s),
	// as with the local cluster's client.
	c.Wrap(kubeclient.CountThrottled)
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return c
}

// probeToken is what the probe asks the remote API server to review: not a
// JWT, so no API server authenticates it.
const probeToken = "meshid-remote-cluster-probe"

// probe checks a new remote cluster with the very call the CA needs, a
// TokenReview (of a token that is no token): ready when the API server
// answers, unauthorized when it refuses the CA's credentials or RBAC,
// unreachable otherwise. It logs the cause, never the kubeconfig.
func (r *Router) probe(rem *remote) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ProbeTimeout)
	defer cancel()
	_, err := rem.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: probeToken, Audiences: r.cfg.Audiences},
	}, metav1.CreateOptions{})
	state := StateReady
	switch {
	case apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err):
		state = StateUnauthorized
		r.log.Warn("remote cluster refuses the CA's credentials: it must allow tokenreviews create", logs.KeyCluster, rem.id, logs.KeyError, err)
	case err != nil:
		state = StateUnreachable
		r.log.Warn("remote cluster unreachable", logs.KeyCluster, rem.id, logs.KeyError, err)
	}
	// Under the lock, so that a removal cannot come between the check
	// and the gauge (which would bring a removed cluster's series back).
	r.mu.RLock()
	defer r.mu.RUnlock()
	if current := r.entries[rem.id]; current != nil && current.rem == rem {
		r.metrics.setState(rem.id, state)
	}
}
