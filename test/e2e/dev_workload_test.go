package e2e_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// Issue 16: `meshid dev` serves the SPIFFE Workload API at
// <state-dir>/workload.sock, from the same cache as its SDS socket: a
// go-spiffe client gets the identity Envoy gets, verified by the bundle the
// API hands out.
func TestDevServesWorkloadAPI(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := "unix://" + filepath.Join(d.stateDir, "workload.sock")
	xctx, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr(addr))
	if err != nil {
		t.Fatal(err)
	}
	svid := xctx.DefaultSVID()
	bundle, err := xctx.Bundles.GetX509BundleForTrustDomain(td)
	if err != nil {
		t.Fatal(err)
	}
	verifySVID(t, svid, bundle, time.Now(), mustID(t, "default", "default"))
	// The same certificate as SDS's default.
	got := openSotw(t, sdsClient(t, d.sock), "default").recvNames("default")
	if !svidOf(t, got["default"]).Certificates[0].Equal(svid.Certificates[0]) {
		t.Fatal("the Workload API and SDS serve different certificates")
	}
}
