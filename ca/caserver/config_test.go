package caserver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/caserver"
)

// TestEveryInvalidFieldReported: a Config with several invalid fields is
// refused with one error that names each of them, so an operator fixes
// them in one go instead of one per start.
func TestEveryInvalidFieldReported(t *testing.T) {
	_, err := caserver.New(caserver.Config{
		RootKeyType: "ec-p999",
		Rotation:    caserver.RotationConfig{Propagation: -time.Minute},
		Issuance:    caserver.IssuanceConfig{MaxTTL: -time.Hour},
		JWT:         caserver.JWTConfig{SVIDTTL: 2 * time.Hour},
		Limits:      caserver.LimitsConfig{Rate: -1, MaxConnectionsPerIP: -2},
		Authn:       caserver.AuthnConfig{TokenVerification: "sometimes"},
		Kube:        caserver.KubeConfig{QPS: -5, PodName: "p"},
		Runtime:     caserver.RuntimeConfig{MemoryLimit: -1},
	})
	if err == nil {
		t.Fatal("New accepted a Config with nine invalid fields")
	}
	for _, field := range []string{
		"RootKeyType", "Rotation.Propagation", "Issuance.MaxTTL", "JWT.SVIDTTL",
		"Limits.Rate", "Limits.MaxConnectionsPerIP", "Authn.TokenVerification",
		"Kube.QPS", "Runtime.MemoryLimit",
	} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("the error does not name %s:\n%v", field, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 9 {
		t.Errorf("%d errors, want 9 (one per invalid field):\n%v", n, err)
	}
}
