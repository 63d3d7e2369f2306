package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// TestFreshTokensFlags: --fresh-tokens refuses what would not make every
// token fresh once, before any request to a cluster.
func TestFreshTokensFlags(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	for _, tc := range []struct {
		f    benchCAFlags
		want string
	}{
		{benchCAFlags{freshTokens: 10, caRoot: "r.pem"}, "needs --kubeconfig"},
		{benchCAFlags{freshTokens: 10, kubeconfig: "k"}, "needs --ca-root"},
		{benchCAFlags{freshTokens: 10, kubeconfig: "k", caRoot: "r.pem", tokenFile: "t"}, "excludes --token-file"},
		{benchCAFlags{freshTokens: 10, kubeconfig: "k", caRoot: "r.pem", sweep: "1,2"}, "excludes --token-file"},
		{benchCAFlags{freshTokens: 10, kubeconfig: "k", caRoot: "r.pem", requests: 11}, "is more than --fresh-tokens"},
	} {
		_, _, err := prepareFresh(context.Background(), &tc.f, td, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		}
	}
	if got := formatRequests(map[string]float64{"tokenreviews": 1000, "": 2}, 1000); got != "(non-resource)=2 tokenreviews=1000 (1002.0 per 1,000 CSRs)" {
		t.Errorf("formatRequests = %q", got)
	}
	if got := formatRequests(nil, 1000); got != "none" {
		t.Errorf("formatRequests(nil) = %q", got)
	}
}
