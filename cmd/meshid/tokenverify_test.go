package main

import (
	"testing"

	"github.com/meshid/meshid/ca/authn/boundtoken"
)

// TestTokenVerificationFlag: --token-verification reaches the Config,
// auto by default, and an unknown mode is an error.
func TestTokenVerificationFlag(t *testing.T) {
	clearServerEnv(t)
	if got := serverConfigOf(t).Authn.TokenVerification; got != boundtoken.ModeAuto {
		t.Fatalf("default %q, want auto", got)
	}
	for _, m := range []boundtoken.Mode{boundtoken.ModeLocal, boundtoken.ModeTokenReview} {
		if got := serverConfigOf(t, "--token-verification", string(m)).Authn.TokenVerification; got != m {
			t.Fatalf("--token-verification %s: %q", m, got)
		}
	}
	if _, _, err := configsOf(t, "server", "--token-verification", "fast"); err == nil {
		t.Fatal("--token-verification fast accepted")
	}
}
