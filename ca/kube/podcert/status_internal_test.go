package podcert

import (
	"crypto/x509"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/utils/ptr"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
)

type fixedRoots struct{ b *keystore.Bundle }

func (f fixedRoots) Bundle() *keystore.Bundle { return f.b }

// TestTTLMakesTheExactLifetime: the TTL asked for makes the leaf live
// exactly min(maxExpirationSeconds, MaxTTL, DefaultTTL), at least an hour,
// whether the Authority backdates by its clock skew or only to a young
// CA's notBefore; the API server refuses a lifetime above
// maxExpirationSeconds or under an hour.
func TestTTLMakesTheExactLifetime(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 123456789, time.UTC)
	for _, tc := range []struct {
		name        string
		maxExp      *int32
		def, max    time.Duration
		caAge       time.Duration
		wantLife    time.Duration
		wantBackdat time.Duration
	}{
		{"default request", nil, 24 * time.Hour, 90 * 24 * time.Hour, time.Hour, 24 * time.Hour, ca.DefaultClockSkew},
		{"one hour asked", ptr.To[int32](3600), 24 * time.Hour, 90 * 24 * time.Hour, time.Hour, time.Hour, ca.DefaultClockSkew},
		{"short default TTL", ptr.To[int32](86400), 2 * time.Hour, 90 * 24 * time.Hour, time.Hour, 2 * time.Hour, ca.DefaultClockSkew},
		{"default under an hour", ptr.To[int32](86400), 30 * time.Minute, 90 * 24 * time.Hour, time.Hour, time.Hour, ca.DefaultClockSkew},
		{"max TTL", ptr.To[int32](7862400), 90 * 24 * time.Hour, 48 * time.Hour, time.Hour, 48 * time.Hour, ca.DefaultClockSkew},
		{"CA made 10s ago", ptr.To[int32](3600), 24 * time.Hour, 90 * 24 * time.Hour, 10 * time.Second, time.Hour, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caNB := now.Add(-tc.caAge).Truncate(time.Second)
			c := &Controller{cfg: Config{DefaultTTL: tc.def, MaxTTL: tc.max,
				Roots: fixedRoots{&keystore.Bundle{Cert: &x509.Certificate{NotBefore: caNB}}}}}
			pcr := &certificatesv1.PodCertificateRequest{Spec: certificatesv1.PodCertificateRequestSpec{MaxExpirationSeconds: tc.maxExp}}
			ttl := c.ttl(pcr, now)
			// What the Authority does (ca.window, then whole seconds),
			// 300µs later.
			signNow := now.Add(300 * time.Microsecond)
			nb := signNow.Add(-ca.DefaultClockSkew)
			if nb.Before(caNB) {
				nb = caNB
			}
			leaf := &x509.Certificate{NotBefore: nb.Truncate(time.Second), NotAfter: signNow.Add(ttl).Truncate(time.Second)}
			if life := leaf.NotAfter.Sub(leaf.NotBefore); life != tc.wantLife {
				t.Fatalf("lifetime %s, want %s (ttl %s)", life, tc.wantLife, ttl)
			}
			if err := checkLifetime(pcr, leaf); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRefreshWithin: beginRefreshAt is moved into [notBefore+10m,
// notAfter-10m] in whole seconds, whatever the grace ratio gave.
func TestRefreshWithin(t *testing.T) {
	nb := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	na := nb.Add(time.Hour)
	for _, in := range []time.Time{nb, nb.Add(time.Minute), nb.Add(30*time.Minute + 500*time.Millisecond), na.Add(-time.Minute), na} {
		got := refreshWithin(in, nb, na)
		if got.Before(nb.Add(10*time.Minute)) || got.After(na.Add(-10*time.Minute)) || got.Nanosecond() != 0 {
			t.Errorf("refreshWithin(%s) = %s", in, got)
		}
	}
}

// TestValidateSignerName: what the API server refuses as a signer name is
// refused here, the reserved kubernetes.io domain included.
func TestValidateSignerName(t *testing.T) {
	for name, ok := range map[string]bool{
		"meshid.io/workload": true, "example.com/a/b": true,
		"": false, "workload": false, "meshid.io/": false, "/workload": false,
		"kubernetes.io/kube-apiserver-client-pod": false, "x.kubernetes.io/y": false, "Upper.io/x": false,
	} {
		if err := ValidateSignerName(name); (err == nil) != ok {
			t.Errorf("ValidateSignerName(%q) = %v", name, err)
		}
	}
}
