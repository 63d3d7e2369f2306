package step_test

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/ca/upstream/step"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/testkit"
)

// answer makes the test upstream's answer to a sign request for the CSR's
// key: an HTTP status and a JSON body.
type answer func(t *testing.T, csrKey crypto.PublicKey) (int, any)

// fakeStep is a TLS server speaking step-ca's API (/1.0/roots,
// /1.0/sign) that reports root as its root, answers every sign request
// with answer, and keeps the claims of the last token it was sent,
// checked against the provisioner's public key.
type fakeStep struct {
	url    *upstream.URL
	mu     sync.Mutex
	claims map[string]any
	kid    string
	tokErr error
}

func newFakeStep(t *testing.T, root *x509.Certificate, pub *jose.JSONWebKey, a answer) *fakeStep {
	t.Helper()
	f := &fakeStep{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/1.0/roots":
			_ = json.NewEncoder(w).Encode(map[string]any{"crts": []string{string(certs.EncodeCertificates(root))}})
			return
		case "/1.0/sign":
		default:
			http.NotFound(w, r)
			return
		}
		var req struct{ CSR, OTT string }
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		blk, _ := pem.Decode([]byte(req.CSR))
		if blk == nil {
			http.Error(w, "bad CSR", http.StatusBadRequest)
			return
		}
		csr, err := x509.ParseCertificateRequest(blk.Bytes)
		if err != nil {
			http.Error(w, "bad CSR", http.StatusBadRequest)
			return
		}
		f.record(req.OTT, pub)
		status, body := a(t, csr.PublicKey)
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, certs.EncodeCertificates(srv.Certificate()), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := upstream.ParseURL("step+https://" + srv.Listener.Addr().String() + "?provisioner=meshid&ca=" + caFile)
	if err != nil {
		t.Fatal(err)
	}
	f.url = u
	return f
}

func (f *fakeStep) record(ott string, pub *jose.JSONWebKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tok, err := jwt.ParseSigned(ott, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		f.tokErr = err
		return
	}
	f.claims = map[string]any{}
	f.tokErr = tok.Claims(pub, &f.claims)
	f.kid = tok.Headers[0].KeyID
}

type spyTarget struct{ offered int }

func (s *spyTarget) SetBundle(*keystore.Bundle) error { s.offered++; return nil }

// provisionerKey writes a private JWK (mode 0600) and returns its file
// and public half.
func provisionerKey(t *testing.T) (string, *jose.JSONWebKey) {
	t.Helper()
	jwk := jose.JSONWebKey{Key: testkit.Key(t, certs.ECP256), KeyID: "kid-1", Algorithm: string(jose.ES256)}
	data, err := json.Marshal(jwk)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "jwk.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	pub := jwk.Public()
	return file, &pub
}

// TestBadAnswersRefused: every answer that is not a CA certificate for
// our key verifying to the returned root (path length and name
// constraints of the issuer included), for long enough, is refused by the
// Renewer with a clear error; an error status, a malformed, huge or
// redirecting answer is an error, not a crash. At a renewal the rotation
// is offered nothing and the current intermediate stays. Each request
// carries a one-time token step-ca would accept for the CSR.
func TestBadAnswersRefused(t *testing.T) {
	now := time.Now()
	root, rootKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "corp root"}, NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 2})
	other, otherKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "another root"}, NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 2})
	td := spiffeid.RequireTrustDomainFromString("example.org")
	tdURI, _ := url.Parse("spiffe://example.org")
	cert := func(t *testing.T, tmpl *x509.Certificate, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
		tmpl.SerialNumber = big.NewInt(now.UnixNano())
		if tmpl.NotBefore.IsZero() {
			tmpl.NotBefore = now.Add(-time.Minute)
		}
		if tmpl.NotAfter.IsZero() {
			tmpl.NotAfter = now.Add(2 * time.Hour)
		}
		tmpl.BasicConstraintsValid = true
		if tmpl.IsCA {
			tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
		}
		return testkit.Certificate(t, tmpl, parent, pub, key)
	}
	pemOf := func(cs ...*x509.Certificate) string { return string(certs.EncodeCertificates(cs...)) }
	ok := func(chain ...*x509.Certificate) (int, any) {
		pems := []string{}
		for _, c := range chain {
			pems = append(pems, pemOf(c))
		}
		return http.StatusCreated, map[string]any{"crt": pems[0], "ca": pems[len(pems)-1], "certChain": pems}
	}
	// issuer returns an intermediate of root with the given constraints.
	issuer := func(t *testing.T, tmpl *x509.Certificate) (*x509.Certificate, crypto.Signer) {
		k := testkit.Key(t, certs.ECP256)
		tmpl.Subject, tmpl.IsCA = pkix.Name{CommonName: "step intermediate"}, true
		return cert(t, tmpl, root, k.Public(), rootKey), k
	}
	cases := map[string]struct {
		a    answer
		want string
	}{
		"not a CA": {func(t *testing.T, pub crypto.PublicKey) (int, any) {
			return ok(cert(t, &x509.Certificate{KeyUsage: x509.KeyUsageDigitalSignature}, root, pub, rootKey))
		}, "not a CA"},
		"another key": {func(t *testing.T, _ crypto.PublicKey) (int, any) {
			return ok(cert(t, &x509.Certificate{IsCA: true}, root, testkit.Key(t, certs.ECP256).Public(), rootKey))
		}, "not for the key"},
		"chain not verifying": {func(t *testing.T, pub crypto.PublicKey) (int, any) {
			return ok(cert(t, &x509.Certificate{IsCA: true}, other, pub, otherKey))
		}, "does not verify"},
		"path length": {func(t *testing.T, pub crypto.PublicKey) (int, any) {
			is, k := issuer(t, &x509.Certificate{MaxPathLenZero: true})
			return ok(cert(t, &x509.Certificate{IsCA: true, MaxPathLenZero: true}, is, pub, k), is)
		}, "does not verify"},
		"name constraints": {func(t *testing.T, pub crypto.PublicKey) (int, any) {
			is, k := issuer(t, &x509.Certificate{MaxPathLen: 1, PermittedURIDomains: []string{"other.org"}})
			return ok(cert(t, &x509.Certificate{IsCA: true, MaxPathLenZero: true, URIs: []*url.URL{tdURI}}, is, pub, k), is)
		}, "does not verify"},
		"too short": {func(t *testing.T, pub crypto.PublicKey) (int, any) {
			return ok(cert(t, &x509.Certificate{IsCA: true, NotAfter: now.Add(10 * time.Minute)}, root, pub, rootKey))
		}, "renewal period"},
		"refused by step-ca": {func(*testing.T, crypto.PublicKey) (int, any) {
			return http.StatusForbidden, map[string]any{"status": 403, "message": "requested duration of 1h0m0s is more than the authorized maximum"}
		}, "HTTP 403: \"requested duration"},
		"malformed": {func(*testing.T, crypto.PublicKey) (int, any) {
			return http.StatusCreated, map[string]any{"crt": 42}
		}, "step-ca sign"},
		"not PEM": {func(*testing.T, crypto.PublicKey) (int, any) {
			return http.StatusCreated, map[string]any{"crt": "garbage", "ca": "garbage"}
		}, "step-ca sign"},
		"huge": {func(*testing.T, crypto.PublicKey) (int, any) {
			return http.StatusCreated, map[string]any{"crt": strings.Repeat("A", step.MaxResponse)}
		}, "more than"},
		"chain too long": {func(t *testing.T, pub crypto.PublicKey) (int, any) {
			c := pemOf(cert(t, &x509.Certificate{IsCA: true}, root, pub, rootKey))
			chain := make([]string, upstream.MaxCerts+1)
			for i := range chain {
				chain[i] = c
			}
			return http.StatusCreated, map[string]any{"crt": c, "certChain": chain}
		}, "more than"},
		"redirect": {nil, "redirect"}, // newRedirectingStep
	}
	keyFile, pub := provisionerKey(t)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var f *fakeStep
			if tc.a == nil {
				f = newRedirectingStep(t, root)
			} else {
				f = newFakeStep(t, root, pub, tc.a)
			}
			cl, err := step.New(step.Config{URL: f.url, CredentialsFile: keyFile})
			if err != nil {
				t.Fatal(err)
			}
			fake := clock.NewFake(now)
			logs := testkit.NewLogRecorder()
			r, err := upstream.NewRenewer(upstream.RenewerConfig{
				Upstream: cl, TrustDomain: td, Lifetime: time.Hour, Clock: fake, Logger: logs.Logger(),
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.Mint(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Mint: %v, want an error containing %q", err, tc.want)
			}
			if refused := errors.Is(err, upstream.ErrRefused); refused != (tc.want == "not a CA" || tc.want == "not for the key" || tc.want == "does not verify" || tc.want == "renewal period") {
				t.Fatalf("Mint: %v: refused by Check %v", err, refused)
			}
			if tc.a != nil {
				checkToken(t, f, root, f.url.Host)
			}
			// The same answer at a renewal: logged, nothing offered, the
			// current intermediate kept.
			key := testkit.Key(t, certs.ECP256)
			cur := &keystore.Bundle{Cert: cert(t, &x509.Certificate{IsCA: true, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}, root, key.Public(), rootKey),
				Key: key, Roots: []*x509.Certificate{root}}
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

// newRedirectingStep answers the sign request with a redirect to a server
// that records whether the token reached it.
func newRedirectingStep(t *testing.T, root *x509.Certificate) *fakeStep {
	t.Helper()
	var leaked sync.Once
	thief := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		leaked.Do(func() { t.Error("the token followed a redirect") })
	}))
	t.Cleanup(thief.Close)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/1.0/roots" {
			_ = json.NewEncoder(w).Encode(map[string]any{"crts": []string{string(certs.EncodeCertificates(root))}})
			return
		}
		http.Redirect(w, r, thief.URL+"/1.0/sign", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, certs.EncodeCertificates(srv.Certificate(), thief.Certificate()), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := upstream.ParseURL("step+https://" + srv.Listener.Addr().String() + "?provisioner=meshid&ca=" + caFile)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeStep{url: u}
}

// checkToken: the last token f got is what step-ca's JWK provisioner
// accepts for the Renewer's CSR: signed by the provisioner key (kid),
// issuer the provisioner, audience the sign endpoint, the CSR's common
// name as subject and its SPIFFE URI as the only SAN, the root's
// fingerprint, a jti, valid for TokenLifetime.
func checkToken(t *testing.T, f *fakeStep, root *x509.Certificate, host string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tokErr != nil || f.claims == nil {
		t.Fatalf("the token does not verify with the provisioner's key: %v", f.tokErr)
	}
	fp := sha256.Sum256(root.Raw)
	c := f.claims
	sans, _ := c["sans"].([]any)
	switch {
	case f.kid != "kid-1", c["iss"] != "meshid", c["aud"] != "https://"+host+"/1.0/sign",
		c["sub"] != "meshid intermediate CA", len(sans) != 1 || sans[0] != "spiffe://example.org",
		c["sha"] != hex.EncodeToString(fp[:]), c["jti"] == nil || c["jti"] == "":
		t.Fatalf("token kid %q claims %v", f.kid, c)
	}
	if exp, nbf := c["exp"].(float64), c["nbf"].(float64); time.Duration(exp-nbf)*time.Second != step.TokenLifetime {
		t.Fatalf("token valid for %vs", exp-nbf)
	}
}
