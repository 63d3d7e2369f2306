package cfssl_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/ca/upstream/cfssl"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// answer makes the test upstream's certificate for the CSR's key.
type answer func(t *testing.T, csrKey crypto.PublicKey) any

// badUpstream is a TLS server speaking cfssl's API (authsign, info) that
// answers every CSR with answer and reports root as its CA.
func badUpstream(t *testing.T, root *x509.Certificate, a answer) *upstream.URL {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		result := map[string]any{"certificate": string(certs.EncodeCertificates(root))}
		if strings.HasSuffix(r.URL.Path, "/authsign") {
			var ar struct{ Request []byte }
			var sr struct {
				CSR string `json:"certificate_request"`
			}
			if json.Unmarshal(body, &ar) != nil || json.Unmarshal(ar.Request, &sr) != nil {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			blk, _ := pem.Decode([]byte(sr.CSR))
			csr, err := x509.ParseCertificateRequest(blk.Bytes)
			if err != nil {
				http.Error(w, "bad CSR", http.StatusBadRequest)
				return
			}
			result["certificate"] = a(t, csr.PublicKey)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"success": true, "result": result, "errors": []any{}, "messages": []any{}})
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, certs.EncodeCertificates(srv.Certificate()), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := upstream.ParseURL("cfssl+https://" + srv.Listener.Addr().String() + "?profile=p&ca=" + caFile)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

type spyTarget struct{ offered int }

func (s *spyTarget) SetBundle(*keystore.Bundle) error { s.offered++; return nil }

// TestBadAnswersRefused: every answer that is not a CA certificate for
// our key verifying to the returned root, for long enough, is refused by
// the Renewer with a clear error; the rotation is offered nothing and the
// current intermediate stays. A malformed answer is an error, not a crash.
func TestBadAnswersRefused(t *testing.T) {
	now := time.Now()
	root, rootKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "corp root"}, NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 1})
	other, otherKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "another root"}, NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 1})
	issue := func(t *testing.T, pub crypto.PublicKey, isCA bool, parent *x509.Certificate, key crypto.Signer, ttl time.Duration) string {
		c := testkit.Certificate(t, &x509.Certificate{
			SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "minted"},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl),
			BasicConstraintsValid: true, IsCA: isCA, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}, parent, pub, key)
		return string(certs.EncodeCertificates(c))
	}
	cases := map[string]struct {
		a    answer
		want string
	}{
		"not a CA": {func(t *testing.T, pub crypto.PublicKey) any { return issue(t, pub, false, root, rootKey, 2*time.Hour) }, "not a CA"},
		"another key": {func(t *testing.T, _ crypto.PublicKey) any {
			return issue(t, testkit.Key(t, certs.ECP256).Public(), true, root, rootKey, 2*time.Hour)
		}, "not for the key"},
		"chain not verifying": {func(t *testing.T, pub crypto.PublicKey) any { return issue(t, pub, true, other, otherKey, 2*time.Hour) }, "does not verify"},
		"too short": {func(t *testing.T, pub crypto.PublicKey) any {
			return issue(t, pub, true, root, rootKey, 10*time.Minute)
		}, "renewal period"},
		"malformed": {func(*testing.T, crypto.PublicKey) any { return 42 }, "cfssl authsign"},
		"not PEM":   {func(*testing.T, crypto.PublicKey) any { return "garbage" }, "cfssl authsign"},
	}
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("0f", 16)), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cl, err := cfssl.New(cfssl.Config{URL: badUpstream(t, root, tc.a), CredentialsFile: keyFile})
			if err != nil {
				t.Fatal(err)
			}
			fake := clock.NewFake(now)
			logs := testkit.NewLogRecorder()
			r, err := upstream.NewRenewer(upstream.RenewerConfig{
				Upstream: cl, TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"),
				Lifetime: time.Hour, Clock: fake, Logger: logs.Logger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Mint(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Mint: %v, want an error containing %q", err, tc.want)
			} else if tc.want != "cfssl authsign" && !errors.Is(err, upstream.ErrRefused) {
				t.Fatalf("Mint: %v is not ErrRefused", err)
			}
			// The same answer at a renewal: logged, nothing offered, the
			// current intermediate kept.
			key := testkit.Key(t, certs.ECP256)
			cur := &keystore.Bundle{Cert: testkit.Certificate(t, &x509.Certificate{
				SerialNumber: big.NewInt(7), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
				BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign,
			}, root, key.Public(), rootKey), Key: key, Roots: []*x509.Certificate{root}}
			spy := &spyTarget{}
			r.Start(cur, time.Time{}, spy)
			testkit.Run(t, "renewer", r.Run)
			logs.WaitForContaining(t, "did not renew", 1)
			if spy.offered != 0 || r.Current() != cur {
				t.Fatalf("a refused answer was offered (%d) or replaced the current intermediate", spy.offered)
			}
		})
	}
}
