package caserver_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/testkit"
)

// TestTokenVerificationMode: an unknown mode is refused; a CA whose
// client is a given KubeClient (no metadata client for the informers)
// sends every token to TokenReview and says so, in the log and in
// meshid_ca_token_verification_mode, whatever was asked. test/kube covers
// local verification against the real API server.
func TestTokenVerificationMode(t *testing.T) {
	if _, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Authn: caserver.AuthnConfig{TokenVerification: "fast"}}); err == nil {
		t.Fatal("New accepted token verification mode fast")
	}
	for _, m := range []boundtoken.Mode{"", boundtoken.ModeLocal, boundtoken.ModeTokenReview} {
		t.Run(string(m), func(t *testing.T) {
			var buf bytes.Buffer
			reg := prometheus.NewRegistry()
			_, err := caserver.New(caserver.Config{
				StateDir: t.TempDir(), Kube: caserver.KubeConfig{
					Client:               fake.NewClientset(),
					DisableRootConfigMap: true,
				},
				Authn: caserver.AuthnConfig{
					TokenVerification: m,
				},

				Registerer: reg,
				Logger:     slog.New(slog.NewTextHandler(&buf, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			if v := testkit.Metric(t, reg, "meshid_ca_token_verification_mode", "mode", "tokenreview"); v != 1 {
				t.Fatalf("mode tokenreview = %v, want 1", v)
			}
			if v := testkit.Metric(t, reg, "meshid_ca_token_verification_mode", "mode", "local"); v != 0 {
				t.Fatalf("mode local = %v, want 0", v)
			}
			if !strings.Contains(buf.String(), "token verification: tokenreview") {
				t.Fatalf("the log does not say tokens go to TokenReview: %q", buf.String())
			}
		})
	}
}
