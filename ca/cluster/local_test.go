package cluster_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/cluster"
)

// TestLocalOnly: first in a chain without a Router, LocalOnly refuses a
// token sent for a cluster other than the local one as the Router refuses
// an unknown cluster (Unauthenticated naming it, and the next
// authenticator never sees the token); a token without ClusterID or with
// the local ID, and a request without a token, reach the next one.
func TestLocalOnly(t *testing.T) {
	ctx := context.Background()
	next := &localAuth{}
	chain := authn.NewChain(cluster.LocalOnly("east"), next)
	for _, id := range []string{"", "east"} {
		c, err := chain.Authenticate(ctx, authn.Credentials{Token: "local-token", ClusterID: id})
		if err != nil || c.ServiceAccount != "local" {
			t.Errorf("ClusterID %q: %v %+v, want the local caller", id, err, c)
		}
	}
	for id, msg := range map[string]string{
		"Kubernetes": `unknown cluster "Kubernetes"`, // the default ID is not east's
		"west":       `unknown cluster "west": this CA has no remote secret or --remote-kubeconfig for it (local cluster "east")`,
		"a/b":        "not a cluster ID",
	} {
		_, err := chain.Authenticate(ctx, authn.Credentials{Token: "local-token", ClusterID: id})
		if ca.KindOf(err) != ca.KindUnauthenticated || !strings.Contains(err.Error(), msg) {
			t.Errorf("ClusterID %q: %v, want Unauthenticated with %q", id, err, msg)
		}
	}
	if n := next.calls.Load(); n != 2 {
		t.Errorf("the next authenticator judged %d tokens, want the 2 local ones", n)
	}
	if _, err := cluster.LocalOnly("east").Authenticate(ctx, authn.Credentials{ClusterID: "west"}); err != authn.ErrNoCredentials {
		t.Errorf("no token: %v, want ErrNoCredentials (a client certificate is judged by the next)", err)
	}
}
