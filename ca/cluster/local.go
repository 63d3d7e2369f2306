package cluster

import (
	"context"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
)

// LocalOnly returns the Authenticator of a CA that knows no cluster but
// its own (no Router: offline JWT only, as `meshid dev`), to put first in
// its chain. It judges no token itself; a token whose request names a
// ClusterID other than localID is refused as the Router refuses an
// unknown cluster (Unauthenticated, naming it, final for the token), so
// that ClusterID means the same with and without a Router (issue 28, hole
// 5: the offline check used to accept such a token). A request without
// ClusterID, with localID (Istio's agents send their CLUSTER_ID, by
// default DefaultLocalID) or without a token goes on unjudged.
func LocalOnly(localID string) authn.Authenticator { return localOnly(localID) }

type localOnly string

func (l localOnly) Authenticate(_ context.Context, creds authn.Credentials) (*authn.Caller, error) {
	if creds.Token == "" || creds.ClusterID == "" || creds.ClusterID == string(l) {
		return nil, authn.ErrNoCredentials
	}
	return nil, authn.FinalForToken(unknownCluster(creds.ClusterID, string(l)))
}

// unknownCluster is the error for a request naming a cluster that is not
// configured (or not valid, which no configured cluster can be).
func unknownCluster(id, local string) error {
	if err := CheckID(id); err != nil {
		return ca.Errorf(ca.KindUnauthenticated, "cluster: the request's ClusterID is not a cluster ID: %v", err)
	}
	return ca.Errorf(ca.KindUnauthenticated, "cluster: unknown cluster %q: this CA has no remote secret or --remote-kubeconfig for it (local cluster %q)", id, local)
}
