package ca_test

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca"
)

// TestCredentialCap is the one rule for X.509 leaves and JWT-SVIDs: what
// is issued ends no later than the presented certificate (which wins over
// a token), else the token; an expired credential, or one with less than
// a whole second left, is Unauthenticated and says which expired.
func TestCredentialCap(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	want := now.Add(time.Hour)
	cert := func(d time.Duration) *x509.Certificate { return &x509.Certificate{NotAfter: now.Add(d)} }
	for _, tc := range []struct {
		name string
		cred ca.Credential
		want time.Time
		err  string
	}{
		{"nothing known", ca.Credential{}, want, ""},
		{"token outlives it", ca.Credential{TokenExpiry: now.Add(2 * time.Hour)}, want, ""},
		{"token ends sooner", ca.Credential{TokenExpiry: now.Add(time.Minute)}, now.Add(time.Minute), ""},
		{"certificate ends sooner", ca.Credential{Certificate: cert(2 * time.Minute)}, now.Add(2 * time.Minute), ""},
		{"certificate wins over token", ca.Credential{Certificate: cert(2 * time.Minute), TokenExpiry: now.Add(time.Minute)}, now.Add(2 * time.Minute), ""},
		{"token expired", ca.Credential{TokenExpiry: now.Add(-time.Second)}, time.Time{}, "the token expired at 2026-12-04T11:59:59Z"},
		{"token ends now", ca.Credential{TokenExpiry: now}, time.Time{}, "the token expired"},
		{"less than a second left", ca.Credential{TokenExpiry: now.Add(999 * time.Millisecond)}, time.Time{}, "the token expired"},
		{"certificate expired", ca.Credential{Certificate: cert(-time.Minute)}, time.Time{}, "the presented client certificate expired at 2026-12-04T11:59:00Z"},
	} {
		got, err := tc.cred.Cap(now, want)
		switch {
		case tc.err == "" && (err != nil || !got.Equal(tc.want)):
			t.Errorf("%s: %s, %v; want %s", tc.name, got, err, tc.want)
		case tc.err != "" && (ca.KindOf(err) != ca.KindUnauthenticated || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want Unauthenticated with %q", tc.name, err, tc.err)
		}
	}
}
