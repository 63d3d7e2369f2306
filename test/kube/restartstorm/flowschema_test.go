package restartstorm_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshid/meshid/test/kube/harness"
)

// classify sends method path (body, if any, as JSON) with cfg's identity
// and returns the FlowSchema and priority level UIDs the API server's APF
// filter put on the response.
func classify(t *testing.T, cfg *rest.Config, method, path, body string) (flowSchema, level types.UID) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, cfg.Host+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return types.UID(resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedFlowSchemaUID)),
		types.UID(resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID))
}

// TestFlowSchemaClassifiesTheCAsTokenReviews: deploy/30-flowcontrol.yaml,
// server-side applied (TestMain), puts the CA service account's
// TokenReviews, and nothing else, in its own priority level.
func TestFlowSchemaClassifiesTheCAsTokenReviews(t *testing.T) {
	var fsUID, plUID types.UID
	for _, o := range flowObjects {
		switch o.GetKind() {
		case "FlowSchema":
			fsUID = o.GetUID()
		case "PriorityLevelConfiguration":
			plUID = o.GetUID()
		}
	}
	if fsUID == "" || plUID == "" {
		t.Fatalf("deploy/30-flowcontrol.yaml did not yield a FlowSchema and a priority level: %v", flowObjects)
	}
	caCfg, err := clientcmd.BuildConfigFromFlags("", caKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	const review = `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"not-a-token"}}`

	fs, pl := classify(t, caCfg, http.MethodPost, "/apis/authentication.k8s.io/v1/tokenreviews", review)
	if fs != fsUID || pl != plUID {
		t.Errorf("the CA's TokenReview: FlowSchema %q level %q, want ours (%q, %q)", fs, pl, fsUID, plUID)
	}
	// The CA's other traffic keeps the default classification.
	fs, _ = classify(t, caCfg, http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/istio-system/leases/meshid-ca", "")
	if fs == "" || fs == fsUID {
		t.Errorf("the CA's Lease read classified by FlowSchema %q, want a default one", fs)
	}
	// Another service account's TokenReview is not the CA's, whatever it
	// is allowed to do (classification comes before authorization).
	ctx := context.Background()
	if err := cluster.CreateServiceAccount(ctx, "impostor", "meshid"); err != nil {
		t.Fatal(err)
	}
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: "impostor", ServiceAccount: "meshid", Expiration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fs, _ = classify(t, cluster.TokenConfig(tok), http.MethodPost, "/apis/authentication.k8s.io/v1/tokenreviews", review)
	if fs == "" || fs == fsUID {
		t.Errorf("impostor/meshid's TokenReview classified by FlowSchema %q, want a default one (not the CA's %q)", fs, fsUID)
	}
}
