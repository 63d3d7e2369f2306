package ca_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

func TestSignTTL(t *testing.T) {
	root := rootBundle(t, certs.ECP256, t0) // valid from t0-5m for 10 years
	short := intermediateBundle(t, certs.ECP256, t0)
	// A root that expires in under 2 h: as another root of the bundle (a
	// root rotation) it does not cap the leaf, which does not chain to it;
	// as the root of the signing CA, which outlives it, it does.
	soon, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), Clock: clock.NewFake(t0), TTL: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	otherRoot := &keystore.Bundle{Cert: root.Cert, Key: root.Key, Roots: []*x509.Certificate{root.Cert, soon.Cert}}
	interKey := mustKey(t, certs.ECP256)
	inter, err := certs.NewIntermediateCA(certs.CASpec{
		Subject: pkix.Name{CommonName: "outlives its root", Organization: []string{td.Name()}}, Key: interKey,
		NotBefore: t0.Add(-time.Hour), TTL: 365 * 24 * time.Hour, MaxPathLen: -1,
	}, soon.Cert, soon.Key)
	if err != nil {
		t.Fatal(err)
	}
	rootFirst := &keystore.Bundle{Cert: inter, Key: interKey, Roots: soon.Roots}
	tests := []struct {
		name          string
		bundle        *keystore.Bundle
		now           time.Time
		cfg           ca.Config
		ttl           time.Duration
		wantKind      ca.Kind // KindInternal = success
		wantNotBefore time.Time
		wantNotAfter  time.Time
	}{
		{name: "0 means the default", bundle: root, now: t0, ttl: 0, wantNotBefore: t0.Add(-time.Minute), wantNotAfter: t0.Add(24 * time.Hour)},
		{name: "1h", bundle: root, now: t0, ttl: time.Hour, wantNotBefore: t0.Add(-time.Minute), wantNotAfter: t0.Add(time.Hour)},
		{name: "exactly the maximum", bundle: root, now: t0, ttl: 90 * 24 * time.Hour, wantNotBefore: t0.Add(-time.Minute), wantNotAfter: t0.Add(90 * 24 * time.Hour)},
		{name: "above the maximum", bundle: root, now: t0, ttl: 90*24*time.Hour + time.Second, wantKind: ca.KindInvalidArgument},
		{name: "negative", bundle: root, now: t0, ttl: -time.Second, wantKind: ca.KindInvalidArgument},
		{name: "configured default and skew", bundle: root, now: t0, cfg: ca.Config{DefaultTTL: 12 * time.Hour, ClockSkew: 2 * time.Minute}, wantNotBefore: t0.Add(-2 * time.Minute), wantNotAfter: t0.Add(12 * time.Hour)},
		{name: "configured maximum", bundle: root, now: t0, cfg: ca.Config{DefaultTTL: time.Hour, MaxTTL: 2 * time.Hour}, ttl: 3 * time.Hour, wantKind: ca.KindInvalidArgument},
		{name: "NotBefore not before the issuer's", bundle: root, now: t0, cfg: ca.Config{ClockSkew: time.Hour}, wantNotBefore: root.Cert.NotBefore, wantNotAfter: t0.Add(24 * time.Hour)},
		{name: "NotAfter capped at the issuer's", bundle: short, now: short.Cert.NotAfter.Add(-time.Hour), wantNotBefore: short.Cert.NotAfter.Add(-time.Hour - time.Minute), wantNotAfter: short.Cert.NotAfter},
		{name: "NotAfter not capped by another root's", bundle: otherRoot, now: t0, wantNotBefore: t0.Add(-time.Minute), wantNotAfter: t0.Add(24 * time.Hour)},
		{name: "NotAfter capped at the root's", bundle: rootFirst, now: t0, wantNotBefore: t0.Add(-time.Minute), wantNotAfter: soon.Cert.NotAfter},
		{name: "CA expired", bundle: short, now: short.Cert.NotAfter.Add(time.Second), wantKind: ca.KindUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			cfg := tc.cfg
			cfg.TrustDomain, cfg.Bundle, cfg.Clock, cfg.Logger = td, tc.bundle, clk, discard
			a, err := ca.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			clk.Set(tc.now)
			pemCSR, _ := mkCSR(t, csrSpec{})
			iss, err := parseAndSign(a, pemCSR, callerID, tc.ttl)
			if tc.wantKind != ca.KindInternal {
				if k := ca.KindOf(err); err == nil || k != tc.wantKind {
					t.Fatalf("err = %v (kind %v), want kind %v", err, k, tc.wantKind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !iss.Leaf.NotBefore.Equal(tc.wantNotBefore) {
				t.Errorf("NotBefore %v, want %v", iss.Leaf.NotBefore, tc.wantNotBefore)
			}
			if !iss.Leaf.NotAfter.Equal(tc.wantNotAfter) {
				t.Errorf("NotAfter %v, want %v", iss.Leaf.NotAfter, tc.wantNotAfter)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	good := rootBundle(t, certs.ECP256, t0)
	other := rootBundle(t, certs.ECP256, t0)
	mismatched := &keystore.Bundle{Cert: good.Cert, Key: other.Key, Roots: good.Roots}
	tests := []struct {
		name string
		cfg  ca.Config
		want string
	}{
		{"no trust domain", ca.Config{Bundle: good}, "trust domain"},
		{"no bundle", ca.Config{TrustDomain: td}, "bundle is required"},
		{"default above maximum", ca.Config{TrustDomain: td, Bundle: good, DefaultTTL: 48 * time.Hour, MaxTTL: 24 * time.Hour}, "exceeds the maximum"},
		{"negative skew", ca.Config{TrustDomain: td, Bundle: good, ClockSkew: -time.Second}, "negative"},
		{"key does not match", ca.Config{TrustDomain: td, Bundle: mismatched}, "does not match"},
		{"bundle expired", ca.Config{TrustDomain: td, Bundle: good, Clock: clock.NewFake(t0.Add(11 * 365 * 24 * time.Hour))}, "expired"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = discard
			if tc.cfg.Clock == nil {
				tc.cfg.Clock = clock.NewFake(t0)
			}
			_, err := ca.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestSetBundle(t *testing.T) {
	clk := clock.NewFake(t0)
	first := rootBundle(t, certs.ECP256, t0)
	second := intermediateBundle(t, certs.RSA2048, t0)
	a := newAuthority(t, first, clk)
	if a.Bundle() != first || a.TrustDomain() != td {
		t.Fatalf("Bundle/TrustDomain do not report the configuration")
	}
	if err := a.SetBundle(second); err != nil {
		t.Fatal(err)
	}
	if a.Bundle() != second {
		t.Fatalf("Bundle() did not switch")
	}
	pemCSR, _ := mkCSR(t, csrSpec{})
	iss, err := parseAndSign(a, pemCSR, callerID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.Leaf.CheckSignatureFrom(second.Cert); err != nil {
		t.Fatalf("leaf not signed by the new CA: %v", err)
	}
	if len(iss.Chain) != 2 || !iss.Roots[0].Equal(second.Roots[0]) {
		t.Fatalf("chain/roots are not the new bundle's")
	}

	// An invalid bundle is refused and the current one stays.
	bad := &keystore.Bundle{Cert: first.Cert, Key: second.Key, Roots: first.Roots}
	if err := a.SetBundle(bad); err == nil {
		t.Fatalf("SetBundle accepted a key that does not match")
	}
	if a.Bundle() != second {
		t.Fatalf("a refused bundle replaced the current one")
	}
}

// TestSignConcurrentWithSetBundle signs from many goroutines while the
// bundle is swapped; every leaf must verify against the bundle it names.
// Run with -race.
func TestSignConcurrentWithSetBundle(t *testing.T) {
	clk := clock.NewFake(t0)
	bundles := []*keystore.Bundle{rootBundle(t, certs.ECP256, t0), intermediateBundle(t, certs.ECP384, t0)}
	a := newAuthority(t, bundles[0], clk)
	csrs := make([][]byte, 8)
	for i := range csrs {
		csrs[i], _ = mkCSR(t, csrSpec{uris: []string{callerID.String()}})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				iss, err := parseAndSign(a, csrs[(g+i)%len(csrs)], callerID, 0)
				if err != nil {
					errs <- err
					return
				}
				issuer := iss.Roots[0]
				if len(iss.Chain) > 0 {
					issuer = iss.Chain[0]
				}
				if err := iss.Leaf.CheckSignatureFrom(issuer); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		if err := a.SetBundle(bundles[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	b := intermediateBundle(t, certs.ECP256, t0)
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clock.NewFake(t0), Logger: discard, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	good, _ := mkCSR(t, csrSpec{})
	foreign, _ := mkCSR(t, csrSpec{uris: []string{otherID.String()}})
	dns, _ := mkCSR(t, csrSpec{dns: []string{"x.example"}})
	for _, c := range []struct {
		csr []byte
		ttl time.Duration
	}{{good, 0}, {good, time.Hour}, {foreign, 0}, {dns, 0}, {good, 1000 * 24 * time.Hour}} {
		_, _ = parseAndSign(a, c.csr, callerID, c.ttl)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			switch {
			case m.Counter != nil:
				got[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				got[name] = m.Gauge.GetValue()
			case m.Histogram != nil:
				got[name] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	for name, v := range map[string]float64{
		"meshid_ca_certificates_issued_total":               2,
		"meshid_ca_sign_failures_total/identity_mismatch":   1,
		"meshid_ca_sign_failures_total/forbidden_san":       1,
		"meshid_ca_sign_failures_total/ttl":                 1,
		"meshid_ca_sign_failures_total/weak_key":            0,
		"meshid_ca_sign_duration_seconds":                   2,
		"meshid_ca_root_expiry_timestamp_seconds":           float64(b.Roots[0].NotAfter.Unix()),
		"meshid_ca_cert_expiry_timestamp_seconds":           float64(b.Cert.NotAfter.Unix()),
		"meshid_ca_sign_failures_total/forbidden_extension": 0,
	} {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
		}
	}
	// A second Authority on the same registry is an error, not a panic.
	if _, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clock.NewFake(t0), Logger: discard, Registerer: reg}); err == nil {
		t.Errorf("duplicate registration not reported")
	}
}

func TestAuditLog(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	b := rootBundle(t, certs.ECP256, t0)
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clock.NewFake(t0), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	pemCSR, _ := mkCSR(t, csrSpec{})
	csr, err := ca.ParseCSR(pemCSR)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID, Caller: "default/default (jwt)"})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d log lines for one certificate, want 1:\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"msg":       "certificate issued",
		"serial":    iss.Leaf.SerialNumber.Text(16),
		"spiffe_id": callerID.String(),
		"caller":    "default/default (jwt)",
		"not_after": iss.Leaf.NotAfter.Format(time.RFC3339),
	} {
		if got, _ := rec[k].(string); got != want {
			t.Errorf("log %s = %q, want %q", k, got, want)
		}
	}
	if strings.Contains(buf.String(), "PRIVATE KEY") || strings.Contains(buf.String(), "CERTIFICATE REQUEST") {
		t.Errorf("audit line carries PEM material: %s", buf.String())
	}
}

func TestIssueServing(t *testing.T) {
	clk := clock.NewFake(t0)
	b := intermediateBundle(t, certs.ECP256, t0)
	a := newAuthority(t, b, clk)
	key := mustKey(t, certs.ECP256)
	dns := []string{"localhost", "istiod.istio-system.svc"}
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	iss, err := a.IssueServing(key.Public(), dns, ips, 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf := iss.Leaf
	if leaf.IsCA || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("serving cert profile wrong: CA=%v EKU=%v", leaf.IsCA, leaf.ExtKeyUsage)
	}
	if leaf.Subject.CommonName != dns[0] {
		t.Errorf("serving cert CN %q, want the first DNS name %q", leaf.Subject.CommonName, dns[0])
	}
	if !certs.KeyMatches(leaf.PublicKey, key) || !leaf.NotAfter.Equal(t0.Add(ca.DefaultTTL)) {
		t.Errorf("serving cert key or lifetime wrong: NotAfter %v", leaf.NotAfter)
	}
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: t0}
	for _, r := range iss.Roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range iss.Chain {
		opts.Intermediates.AddCert(c)
	}
	for _, name := range []string{"localhost", "istiod.istio-system.svc", "127.0.0.1"} {
		opts.DNSName = name
		if _, err := leaf.Verify(opts); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if _, err := a.IssueServing(key.Public(), dns, nil, -time.Hour); ca.KindOf(err) != ca.KindInvalidArgument {
		t.Errorf("negative TTL: %v, want invalid_argument", err)
	}
	// The workload limits do not apply to the CA's own serving certificate
	// (`meshid server --max-ttl 3m --default-ttl 90s` must start), but the
	// CA certificate's expiry still does.
	short, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clk, Logger: discard, DefaultTTL: 90 * time.Second, MaxTTL: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for ttl, want := range map[time.Duration]time.Time{
		0:                         t0.Add(ca.DefaultTTL),
		2 * time.Hour:             t0.Add(2 * time.Hour),
		10 * 365 * 24 * time.Hour: b.Cert.NotAfter,
	} {
		iss, err := short.IssueServing(key.Public(), dns, nil, ttl)
		if err != nil {
			t.Fatalf("serving TTL %v with workload maximum 3m: %v", ttl, err)
		}
		if !iss.Leaf.NotAfter.Equal(want) {
			t.Errorf("serving TTL %v: NotAfter %v, want %v", ttl, iss.Leaf.NotAfter, want)
		}
	}
	if _, err := a.IssueServing(key.Public(), nil, nil, 0); ca.KindOf(err) != ca.KindInvalidArgument {
		t.Errorf("no names: %v, want invalid_argument", err)
	}
}

// TestSignCanceled: a request whose context is done is not signed.
func TestSignCanceled(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	pemCSR, _ := mkCSR(t, csrSpec{})
	csr, err := ca.ParseCSR(pemCSR)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Sign(ctx, ca.Request{CSR: csr, ID: callerID}); ca.KindOf(err) != ca.KindUnavailable {
		t.Fatalf("Sign(canceled) = %v, want unavailable", err)
	}
}

// TestRenewalCappedAtPresentedCert: the leaf of a client-certificate
// renewal ends no later than the presented certificate; a presented
// certificate already expired is refused as Unauthenticated.
func TestRenewalCappedAtPresentedCert(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	pemCSR, _ := mkCSR(t, csrSpec{uris: []string{callerID.String()}})
	csr, err := ca.ParseCSR(pemCSR)
	if err != nil {
		t.Fatal(err)
	}
	presented := &x509.Certificate{SerialNumber: big.NewInt(42), NotAfter: t0.Add(time.Hour)}
	iss, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID, TTL: 48 * time.Hour, Renewal: presented})
	if err != nil {
		t.Fatal(err)
	}
	if !iss.Leaf.NotAfter.Equal(presented.NotAfter) {
		t.Fatalf("renewed leaf NotAfter %s, want the presented certificate's %s", iss.Leaf.NotAfter, presented.NotAfter)
	}
	presented.NotAfter = t0
	if _, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID, Renewal: presented}); ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("renewal with an expired certificate = %v, want unauthenticated", err)
	}
}

// TestDefaultTTLMayEqualMaximum: a default TTL equal to the maximum is a
// valid configuration (only a default above it is refused), and a request
// without a TTL then gets that maximum.
func TestDefaultTTLMayEqualMaximum(t *testing.T) {
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: rootBundle(t, certs.ECP256, t0), Clock: clock.NewFake(t0), Logger: discard,
		DefaultTTL: time.Hour, MaxTTL: time.Hour})
	if err != nil {
		t.Fatalf("DefaultTTL == MaxTTL refused: %v", err)
	}
	pemCSR, _ := mkCSR(t, csrSpec{})
	iss, err := parseAndSign(a, pemCSR, callerID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !iss.Leaf.NotAfter.Equal(t0.Add(time.Hour)) {
		t.Fatalf("NotAfter %v, want %v", iss.Leaf.NotAfter, t0.Add(time.Hour))
	}
}

// TestIssueServingIPOnly: a serving certificate for an IP address alone
// (a CA reached by IP) is issued, with no subject common name.
func TestIssueServingIPOnly(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	key := mustKey(t, certs.ECP256)
	iss, err := a.IssueServing(key.Public(), nil, []net.IP{net.ParseIP("10.0.0.7")}, 0)
	if err != nil {
		t.Fatalf("IP-only serving certificate: %v", err)
	}
	if len(iss.Leaf.IPAddresses) != 1 || !iss.Leaf.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) || len(iss.Leaf.DNSNames) != 0 || iss.Leaf.Subject.CommonName != "" {
		t.Fatalf("IPs %v, DNS names %v, CN %q", iss.Leaf.IPAddresses, iss.Leaf.DNSNames, iss.Leaf.Subject.CommonName)
	}
}

// TestAuditLogAttributes: the audit line of a renewal names the serial of
// the certificate renewed with, a serving certificate's names its DNS
// names, and a workload certificate's has neither. A refusal is logged at
// warning level when it is PermissionDenied (a caller asking for another
// identity) and at info level otherwise.
func TestAuditLogAttributes(t *testing.T) {
	var buf bytes.Buffer
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: rootBundle(t, certs.ECP256, t0), Clock: clock.NewFake(t0),
		Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	last := func() map[string]any {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		var rec map[string]any
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rec); err != nil {
			t.Fatal(err)
		}
		buf.Reset()
		return rec
	}
	pemCSR, _ := mkCSR(t, csrSpec{})
	csr, err := ca.ParseCSR(pemCSR)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID}); err != nil {
		t.Fatal(err)
	}
	if rec := last(); hasKey(rec, "renewed_serial") || hasKey(rec, "dns_names") {
		t.Errorf("workload certificate's audit line: %v", rec)
	}
	presented := &x509.Certificate{SerialNumber: big.NewInt(0x2a), NotAfter: t0.Add(time.Hour)}
	if _, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID, Renewal: presented}); err != nil {
		t.Fatal(err)
	}
	if rec := last(); rec["renewed_serial"] != "2a" {
		t.Errorf("renewal's audit line: renewed_serial %v, want 2a", rec["renewed_serial"])
	}
	if _, err := a.IssueServing(mustKey(t, certs.ECP256).Public(), []string{"ca.example"}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if rec := last(); rec["msg"] != "serving certificate issued" || fmt.Sprint(rec["dns_names"]) != "[ca.example]" {
		t.Errorf("serving certificate's audit line: %v", rec)
	}

	other, _ := mkCSR(t, csrSpec{uris: []string{otherID.String()}})
	dns, _ := mkCSR(t, csrSpec{dns: []string{"x.example"}})
	for _, tc := range []struct {
		pem   []byte
		level string
	}{{other, "WARN"}, {dns, "INFO"}} {
		if _, err := parseAndSign(a, tc.pem, callerID, 0); err == nil {
			t.Fatal("signed")
		}
		if rec := last(); rec["msg"] != "certificate request refused" || rec["level"] != tc.level {
			t.Errorf("refusal logged as %v %v, want %s", rec["level"], rec["msg"], tc.level)
		}
	}
}

func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}
