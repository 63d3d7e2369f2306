package inspect_test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/inspect"
	"github.com/meshid/meshid/testkit"
)

// TestFetchWorkloadAPI reads a real Workload API server (sds/workloadendpoint
// on a SecretManager signed by a real CA) with go-spiffe's client: the SVID
// with its key, verified against the bundle, and the bundle, in the same
// table as SDS inputs.
func TestFetchWorkloadAPI(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	id := spiffeid.RequireFromPath(td, "/ns/shop/sa/cart")
	sock := workloadAPI(t, td, nil)

	inputs, err := inspect.FetchWorkloadAPI(t.Context(), sock, testkit.Guard)
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) != 2 || inputs[0].Name != "svid" || inputs[1].Name != "bundle:cluster.local" {
		t.Fatalf("inputs %v", inputs)
	}
	if inputs[0].Key == nil || len(inputs[0].Roots) != 1 || !inputs[1].Bundle {
		t.Fatalf("svid key %v, roots %d, bundle %v", inputs[0].Key != nil, len(inputs[0].Roots), inputs[1].Bundle)
	}
	inspect.PairKeys(inputs)
	rep := inspect.Check(inputs, inspect.Options{Now: time.Now()})
	var out bytes.Buffer
	if err := inspect.WriteTable(&out, rep, false); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "svid ") || !strings.Contains(s, id.String()) || strings.Contains(s, "false") {
		t.Errorf("table:\n%s", s)
	}
	if _, err := inspect.FetchWorkloadAPI(t.Context(), filepath.Join(testkit.ShortDir(t), "none.sock"), time.Second); err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("absent socket: %v", err)
	}
}
