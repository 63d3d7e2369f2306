package multicluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/caserver"
)

// mintJWT asks the CA for a JWT-SVID with token, sending the ClusterID
// header unless cluster is empty, and validates the answer against the
// CA's JWT bundle.
func (c *ca) mintJWT(ctx context.Context, token, cluster string) (string, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	if cluster != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "ClusterID", cluster)
	}
	resp, err := c.jwt.MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"orders"}})
	if err != nil {
		return "", err
	}
	bundles, err := c.jwt.FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
	if err != nil {
		return "", err
	}
	b, err := jwtbundle.Parse(trustDomain, bundles.GetBundles()[trustDomain.IDString()])
	if err != nil {
		return "", err
	}
	svid, err := jwtsvid.ParseAndValidate(resp.GetSvids()[0].GetSvid(), b, []string{"orders"})
	if err != nil {
		return "", err
	}
	return svid.ID.String(), nil
}

// TestRemoteJWTSVID: a JWT-SVID request routes by ClusterID exactly like
// CreateCertificate: B's token with ClusterID=B gets a JWT-SVID of B's
// workload (reviewed by B's API server); without ClusterID, or as A, it
// is refused.
func TestRemoteJWTSVID(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.kubeconfig")
	if err := os.WriteFile(path, readerKubeconfig(t, clusterB), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCA(t, func(cfg *caserver.Config) { cfg.Clusters.RemoteKubeconfigs = map[string]string{idB: path} })
	wb := newWorkload(t, clusterB, "jwt-b", "backend")

	// The first request waits for the shared JWT keys (the Secret the
	// leader writes); from then on every answer is final.
	var got string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = c.mintJWT(ctx, wb.token(t), idB)
		if status.Code(err) == codes.Unavailable {
			return false, nil
		}
		return true, err
	})
	if err != nil {
		t.Fatalf("B's token with ClusterID=B: %v", err)
	}
	if got != wb.id().String() {
		t.Fatalf("JWT-SVID for %s, want %s", got, wb.id())
	}
	for _, cluster := range []string{"", idA} {
		_, err := c.mintJWT(ctx, wb.token(t), cluster)
		wantCode(t, fmt.Sprintf("B's token with ClusterID %q", cluster), err, codes.Unauthenticated)
	}
	_, err = c.mintJWT(ctx, wb.token(t), "bad cluster")
	wantCode(t, "a ClusterID that is not one", err, codes.InvalidArgument)
}
