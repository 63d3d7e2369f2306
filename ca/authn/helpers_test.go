package authn_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newIssuer(t testing.TB) *devissuer.Issuer {
	t.Helper()
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := devissuer.New(key, "https://issuer.test")
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

func mint(t testing.TB, iss *devissuer.Issuer, ns, sa string, aud []string, ttl time.Duration, now time.Time) string {
	t.Helper()
	tok, err := iss.Mint(ns, sa, aud, ttl, now)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// wantKind fails t unless err is a *ca.Error of kind k whose message does
// not contain the token.
func wantKind(t *testing.T, err error, k ca.Kind, token string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", k)
	}
	var e *ca.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *ca.Error", err)
	}
	if e.Kind != k {
		t.Fatalf("kind %v, want %v: %v", e.Kind, k, err)
	}
	if token != "" && (strings.Contains(err.Error(), token) || strings.Contains(e.Msg, token)) {
		t.Fatalf("error echoes the token: %v", err)
	}
}
