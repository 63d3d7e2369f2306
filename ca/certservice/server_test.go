package certservice_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// verifyChain checks an IstioCertificateResponse cert_chain: leaf first,
// each intermediate as its own element, the root bundle as the last one;
// the leaf verifies to roots with x509.Verify and go-spiffe's x509svid
// and carries want. It returns the leaf.
func verifyChain(t *testing.T, chain []string, roots []*x509.Certificate, wantIntermediates int, want string) *x509.Certificate {
	t.Helper()
	if len(chain) != 2+wantIntermediates {
		t.Fatalf("cert_chain has %d elements, want %d", len(chain), 2+wantIntermediates)
	}
	var parsed []*x509.Certificate
	for i, p := range chain[:len(chain)-1] {
		cs, err := certs.ParseCertificates([]byte(p))
		if err != nil || len(cs) != 1 {
			t.Fatalf("element %d: %d certificates, %v", i, len(cs), err)
		}
		parsed = append(parsed, cs[0])
	}
	gotRoots, err := certs.ParseCertificates([]byte(chain[len(chain)-1]))
	if err != nil || len(gotRoots) != len(roots) {
		t.Fatalf("root bundle: %d certificates, %v; want %d", len(gotRoots), err, len(roots))
	}
	for i := range roots {
		if !gotRoots[i].Equal(roots[i]) {
			t.Fatalf("root %d differs from the CA's", i)
		}
	}
	leaf := parsed[0]
	pool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range parsed[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("x509.Verify: %v", err)
	}
	raw := make([][]byte, len(parsed))
	for i, c := range parsed {
		raw[i] = c.Raw
	}
	id, _, err := x509svid.ParseAndVerify(raw, x509bundle.FromX509Authorities(td, roots))
	if err != nil {
		t.Fatalf("x509svid.ParseAndVerify: %v", err)
	}
	if id.String() != want {
		t.Fatalf("SPIFFE ID %s, want %s", id, want)
	}
	return leaf
}

func TestCreateCertificate(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, serverName := range []string{"istiod.istio-system.svc", "localhost", "meshid.istio-system.svc"} {
		for _, kt := range []certs.KeyType{certs.ECP256, certs.RSA2048, certs.ECP384} {
			t.Run(serverName+"/"+string(kt), func(t *testing.T) {
				c := e.client(t, serverName, nil)
				ctx := withToken(context.Background(), e.token(t, "default", "web"))
				md, _ := structpb.NewStruct(map[string]any{"ClusterID": "Kubernetes", "CertSigner": "", "WorkloadName": "web-0", "Unknown": 1.0})
				resp, err := c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
					Csr:              csrFor(t, testkit.Key(t, kt), sid("default", "web"), nil),
					ValidityDuration: 3600,
					Metadata:         md,
				})
				if err != nil {
					t.Fatal(err)
				}
				leaf := verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, "spiffe://cluster.local/ns/default/sa/web")
				if got := leaf.NotAfter.Sub(leaf.NotBefore); got < time.Hour || got > time.Hour+2*time.Minute {
					t.Fatalf("lifetime %s, want about 1h", got)
				}
			})
		}
	}
}

// newCA returns a CA certificate named name, and its key: a root when
// parent is nil, else signed by parent.
func newCA(t *testing.T, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	spec := certs.CASpec{Subject: pkix.Name{CommonName: name, Organization: []string{td.Name()}}, Key: k, NotBefore: time.Now().Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: -1}
	var c *x509.Certificate
	var err error
	if parent == nil {
		c, err = certs.NewRootCA(spec)
	} else {
		c, err = certs.NewIntermediateCA(spec, parent, parentKey)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func TestCreateCertificateWithIntermediates(t *testing.T) {
	root, rootKey := newCA(t, "root", nil, nil)
	otherRoot, _ := newCA(t, "other root", nil, nil)
	int1, int1Key := newCA(t, "int1", root, rootKey)
	int2, int2Key := newCA(t, "int2", int1, int1Key)
	b := &keystore.Bundle{Cert: int2, Key: int2Key, Intermediates: []*x509.Certificate{int1}, Roots: []*x509.Certificate{root, otherRoot}}
	e := newEnv(t, envOpts{bundle: b})
	resp, err := e.client(t, "localhost", nil).CreateCertificate(withToken(context.Background(), e.token(t, "shop", "cart")),
		&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)})
	if err != nil {
		t.Fatal(err)
	}
	verifyChain(t, resp.CertChain, b.Roots, 2, "spiffe://cluster.local/ns/shop/sa/cart")
	if c, _ := certs.ParseCertificates([]byte(resp.CertChain[1])); !c[0].Equal(int2) {
		t.Fatal("element 1 is not the signing CA")
	}
	if c, _ := certs.ParseCertificates([]byte(resp.CertChain[2])); !c[0].Equal(int1) {
		t.Fatal("element 2 is not the intermediate above it")
	}
}

// TestResponseChainFollowsBundle: the chain and root bundle of a response
// are the CA bundle's at the time of the request (the handler caches their
// PEM per bundle): a new signing CA under the same root, a root added to
// the bundle, a new self-signed root, and a deeper chain (the signing CA
// three levels under the root) each show in the next response.
func TestResponseChainFollowsBundle(t *testing.T) {
	root, rootKey := newCA(t, "root", nil, nil)
	next, _ := newCA(t, "next root", nil, nil)
	a, aKey := newCA(t, "issuing A", root, rootKey)
	b, bKey := newCA(t, "issuing B", root, rootKey)
	i1, i1Key := newCA(t, "policy", root, rootKey)
	i2, i2Key := newCA(t, "region", i1, i1Key)
	i3, i3Key := newCA(t, "cluster", i2, i2Key)
	selfA, selfB := selfSigned(t), selfSigned(t)
	bundles := []struct {
		name string
		b    *keystore.Bundle
		want []*x509.Certificate // the chain between the leaf and the roots
	}{
		{"issuing CA A", &keystore.Bundle{Cert: a, Key: aKey, Roots: []*x509.Certificate{root}}, []*x509.Certificate{a}},
		{"issuing CA B, same root", &keystore.Bundle{Cert: b, Key: bKey, Roots: []*x509.Certificate{root}}, []*x509.Certificate{b}},
		{"a root added", &keystore.Bundle{Cert: b, Key: bKey, Roots: []*x509.Certificate{root, next}}, []*x509.Certificate{b}},
		{"self-signed root", selfA, nil},
		{"another self-signed root", selfB, nil},
		{"three levels under the root", &keystore.Bundle{Cert: i3, Key: i3Key, Intermediates: []*x509.Certificate{i2, i1}, Roots: []*x509.Certificate{root}}, []*x509.Certificate{i3, i2, i1}},
	}
	e := newEnv(t, envOpts{bundle: bundles[0].b})
	c := e.client(t, "localhost", nil)
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	for i, bc := range bundles {
		if i > 0 {
			if err := e.authority.SetBundle(bc.b); err != nil {
				t.Fatalf("%s: %v", bc.name, err)
			}
		}
		for range 2 { // the second response comes from the cache
			resp, err := c.CreateCertificate(withToken(context.Background(), e.token(t, "shop", "cart")), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
			if err != nil {
				t.Fatalf("%s: %v", bc.name, err)
			}
			verifyChain(t, resp.CertChain, bc.b.Roots, len(bc.want), "spiffe://cluster.local/ns/shop/sa/cart")
			for j, w := range bc.want {
				if got, _ := certs.ParseCertificates([]byte(resp.CertChain[1+j])); !got[0].Equal(w) {
					t.Fatalf("%s: element %d is %s, want %s", bc.name, 1+j, got[0].Subject.CommonName, w.Subject.CommonName)
				}
			}
		}
	}
}

func TestCreateCertificateErrors(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.client(t, "istiod.istio-system.svc", nil)
	good := e.token(t, "default", "web")
	forged := func() string { // same issuer URL and kid shape, other key
		k := testkit.Key(t, certs.ECP256)
		other, err := devissuerNew(k, e.issuer.Issuer())
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := other.Mint("default", "web", []string{"istio-ca"}, time.Hour, time.Now())
		return tok
	}()
	expired, _ := e.issuer.Mint("default", "web", []string{"istio-ca"}, time.Minute, time.Now().Add(-time.Hour))
	wrongAud, _ := e.issuer.Mint("default", "web", []string{"kubernetes"}, time.Hour, time.Now())
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	p256 := testkit.Key(t, certs.ECP256)
	web := sid("default", "web")

	tests := []struct {
		name   string
		auth   []string // authorization header values
		csr    string
		ttl    int64
		code   codes.Code
		secret string // must not appear in the message
	}{
		{name: "no token", csr: csrFor(t, p256, web, nil), code: codes.Unauthenticated},
		{name: "not a bearer token", auth: []string{"Basic dXNlcjpwYXNz"}, csr: csrFor(t, p256, web, nil), code: codes.Unauthenticated, secret: "dXNlcjpwYXNz"},
		{name: "bad signature", auth: []string{"Bearer " + forged}, csr: csrFor(t, p256, web, nil), code: codes.Unauthenticated, secret: forged},
		{name: "garbage token", auth: []string{"Bearer not.a.jwt"}, csr: csrFor(t, p256, web, nil), code: codes.Unauthenticated, secret: "not.a.jwt"},
		{name: "expired token", auth: []string{"Bearer " + expired}, csr: csrFor(t, p256, web, nil), code: codes.Unauthenticated, secret: expired},
		{name: "wrong audience", auth: []string{"Bearer " + wrongAud}, csr: csrFor(t, p256, web, nil), code: codes.Unauthenticated, secret: wrongAud},
		{name: "another SA's identity", auth: []string{"Bearer " + good}, csr: csrFor(t, p256, sid("kube-system", "admin"), nil), code: codes.PermissionDenied, secret: good},
		{name: "another trust domain", auth: []string{"Bearer " + good}, csr: csrFor(t, p256, web, func(r *x509.CertificateRequest) {
			r.URIs = []*url.URL{{Scheme: "spiffe", Host: "evil.org", Path: "/ns/default/sa/web"}}
		}), code: codes.PermissionDenied},
		{name: "CA:true", auth: []string{"Bearer " + good}, csr: csrWithCA(t, p256, web), code: codes.InvalidArgument},
		{name: "RSA-1024", auth: []string{"Bearer " + good}, csr: csrFor(t, rsa1024, web, nil), code: codes.InvalidArgument},
		{name: "DNS SAN", auth: []string{"Bearer " + good}, csr: csrFor(t, p256, web, func(r *x509.CertificateRequest) { r.DNSNames = []string{"web.default.svc"} }), code: codes.InvalidArgument},
		{name: "garbage CSR", auth: []string{"Bearer " + good}, csr: "-----BEGIN CERTIFICATE REQUEST-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE REQUEST-----\n", code: codes.InvalidArgument},
		{name: "not PEM", auth: []string{"Bearer " + good}, csr: "hello", code: codes.InvalidArgument},
		{name: "empty CSR", auth: []string{"Bearer " + good}, csr: "", code: codes.InvalidArgument},
		{name: "TTL above max", auth: []string{"Bearer " + good}, csr: csrFor(t, p256, web, nil), ttl: int64((91 * 24 * time.Hour).Seconds()), code: codes.InvalidArgument},
		{name: "negative TTL", auth: []string{"Bearer " + good}, csr: csrFor(t, p256, web, nil), ttl: -1, code: codes.InvalidArgument},
		{name: "TTL overflow", auth: []string{"Bearer " + good}, csr: csrFor(t, p256, web, nil), ttl: 1 << 62, code: codes.InvalidArgument},
		{name: "lower-case scheme accepted", auth: []string{"bearer " + good}, csr: csrFor(t, p256, web, nil), code: codes.OK},
		{name: "second header value used", auth: []string{"Basic x", "BEARER " + good}, csr: csrFor(t, p256, web, nil), code: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			for _, a := range tc.auth {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", a)
			}
			_, err := c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: tc.csr, ValidityDuration: tc.ttl})
			st, _ := status.FromError(err)
			if st.Code() != tc.code {
				t.Fatalf("code %v (%q), want %v", st.Code(), st.Message(), tc.code)
			}
			if tc.code == codes.OK {
				return
			}
			if st.Message() == "" || (tc.secret != "" && strings.Contains(st.Message(), tc.secret)) {
				t.Fatalf("message %q is empty or echoes a secret", st.Message())
			}
		})
	}
	if got := testkit.Metric(t, e.reg, "meshid_ca_requests_total", "code", "Unauthenticated"); got != 6 {
		t.Fatalf("meshid_ca_requests_total{code=Unauthenticated} = %v, want 6", got)
	}
}

func csrWithCA(t *testing.T, key any, id interface{ String() string }) string {
	t.Helper()
	// basicConstraints CA:true as a requested extension.
	ext := pkix.Extension{Id: []int{2, 5, 29, 19}, Critical: true, Value: []byte{0x30, 0x03, 0x01, 0x01, 0xff}}
	u, _ := url.Parse(id.String())
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}, ExtraExtensions: []pkix.Extension{ext}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func TestRateLimit(t *testing.T) {
	clk := fakeClock()
	e := newEnv(t, envOpts{cfg: func(c *certservice.Config) { c.RateLimit, c.RateBurst, c.Clock = 1, 2, clk }})
	c := e.client(t, "localhost", nil)
	call := func(ns, sa string) codes.Code {
		_, err := c.CreateCertificate(withToken(context.Background(), e.token(t, ns, sa)),
			&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, testkit.Key(t, certs.ECP256), sid(ns, sa), nil)})
		return status.Code(err)
	}
	steps := []struct {
		ns, sa  string
		advance time.Duration
		want    codes.Code
	}{
		{"a", "one", 0, codes.OK},
		{"a", "one", 0, codes.OK},                // burst of 2
		{"a", "one", 0, codes.ResourceExhausted}, // bucket empty
		{"b", "two", 0, codes.OK},                // other callers are not affected
		{"a", "one", time.Second, codes.OK},      // one token refilled
		{"a", "one", 0, codes.ResourceExhausted},
	}
	for i, s := range steps {
		clk.Add(s.advance)
		if got := call(s.ns, s.sa); got != s.want {
			t.Fatalf("step %d (%s/%s): %v, want %v", i, s.ns, s.sa, got, s.want)
		}
	}
}

// TestRateLimitAcrossPrunes: Run prunes the rate limiters every minute of
// the injected clock, and a prune forgets only buckets that have refilled:
// a caller that emptied its bucket is still limited after a prune, and
// one that comes back after its bucket refilled gets a full one, not more.
func TestRateLimitAcrossPrunes(t *testing.T) {
	clk := fakeClock()
	t0 := clk.Now()
	// One token every 2 minutes, a burst of 1.
	e := newEnv(t, envOpts{cfg: func(c *certservice.Config) { c.RateLimit, c.RateBurst, c.Clock = 1.0/120, 1, clk }})
	c := e.client(t, "localhost", nil)
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("a", "one"), nil)
	call := func() codes.Code {
		_, err := c.CreateCertificate(withToken(context.Background(), e.token(t, "a", "one")), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
		return status.Code(err)
	}
	// pruneTimerAt waits until Run's prune timer is set for at: Run sets
	// it when it starts and again after each prune, so once it is set for
	// the next minute the prune of this one is done.
	pruneTimerAt := func(at time.Time) {
		t.Helper()
		waitUntil(t, func() bool { return slices.ContainsFunc(clk.Deadlines(), at.Equal) })
	}
	pruneTimerAt(t0.Add(time.Minute))
	for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
		if got := call(); got != want {
			t.Fatalf("call %d: %v, want %v", i, got, want)
		}
	}
	clk.Add(time.Minute) // half a token back: the bucket is kept
	pruneTimerAt(t0.Add(2 * time.Minute))
	if got := call(); got != codes.ResourceExhausted {
		t.Fatalf("after a prune with half a token: %v, want ResourceExhausted (the prune reset the bucket)", got)
	}
	clk.Add(time.Minute) // refilled: forgotten, and the caller starts full
	pruneTimerAt(t0.Add(3 * time.Minute))
	for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
		if got := call(); got != want {
			t.Fatalf("after the bucket refilled, call %d: %v, want %v", i, got, want)
		}
	}
}

func TestClientCertRenewal(t *testing.T) {
	e := newEnv(t, envOpts{})
	key := testkit.Key(t, certs.ECP256)
	resp, err := e.client(t, "localhost", nil).CreateCertificate(withToken(context.Background(), e.token(t, "shop", "cart")),
		&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, key, sid("shop", "cart"), nil)})
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := certs.ParseCertificates([]byte(resp.CertChain[0]))
	own := &tls.Certificate{Certificate: [][]byte{leaf[0].Raw}, PrivateKey: key, Leaf: leaf[0]}

	// A certificate from a CA this server does not know.
	stranger := newEnv(t, envOpts{})
	sresp, err := stranger.client(t, "localhost", nil).CreateCertificate(withToken(context.Background(), stranger.token(t, "shop", "cart")),
		&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, key, sid("shop", "cart"), nil)})
	if err != nil {
		t.Fatal(err)
	}
	sleaf, _ := certs.ParseCertificates([]byte(sresp.CertChain[0]))
	foreign := &tls.Certificate{Certificate: [][]byte{sleaf[0].Raw}, PrivateKey: key, Leaf: sleaf[0]}

	tests := []struct {
		name string
		cert *tls.Certificate
		id   string
		code codes.Code
	}{
		{"renews its own identity", own, "spiffe://cluster.local/ns/shop/sa/cart", codes.OK},
		{"cannot take another identity", own, "spiffe://cluster.local/ns/shop/sa/admin", codes.PermissionDenied},
		{"foreign CA", foreign, "spiffe://cluster.local/ns/shop/sa/cart", codes.Unauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := e.client(t, "localhost", tc.cert)
			id := sid("shop", "cart")
			if tc.code == codes.PermissionDenied {
				id = sid("shop", "admin")
			}
			resp, err := c.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, testkit.Key(t, certs.ECP256), id, nil)})
			if status.Code(err) != tc.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if tc.code == codes.OK {
				verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, tc.id)
			}
		})
	}
	// meshid_ca_authenticated_requests_total counts callers who proved an
	// identity, by how: the first request's token, then the two client
	// certificates this CA issued (the one asking for another identity is
	// authenticated, then refused); the foreign certificate proves nothing.
	for method, want := range map[string]float64{"jwt": 1, "clientcert": 2, "tokenreview": 0, "other": 0} {
		if got := testkit.Metric(t, e.reg, "meshid_ca_authenticated_requests_total", "method", method); got != want {
			t.Errorf("meshid_ca_authenticated_requests_total{method=%q} = %v, want %v", method, got, want)
		}
	}
}

func TestServingCertificate(t *testing.T) {
	clk := fakeClock()
	e := newEnv(t, envOpts{cfg: func(c *certservice.Config) { c.Clock, c.ServingTTL = clk, 2*time.Hour }})
	serving := func(serverName string) *x509.Certificate {
		t.Helper()
		conn, err := tls.Dial("tcp", e.addr, &tls.Config{RootCAs: e.pool(), ServerName: serverName, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("TLS to %s: %v", serverName, err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	first := serving("localhost")
	for _, n := range []string{"istiod.istio-system.svc", "meshid.istio-system.svc", "127.0.0.1"} {
		if got := serving(n); got.SerialNumber.Cmp(first.SerialNumber) != 0 {
			t.Fatalf("%s: a new serving certificate before renewal time", n)
		}
	}
	if err := first.VerifyHostname("not-a-name.example"); err == nil {
		t.Fatal("serving certificate valid for an unexpected name")
	}
	// Half of its life later it is reissued.
	clk.Add(time.Hour + time.Second)
	second := serving("localhost")
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("serving certificate not reissued after half its life")
	}
	// A new CA bundle: the serving certificate follows it.
	nb := selfSigned(t)
	if err := e.authority.SetBundle(nb); err != nil {
		t.Fatal(err)
	}
	third := serving("localhost")
	if err := third.CheckSignatureFrom(nb.Cert); err != nil {
		t.Fatalf("serving certificate not reissued by the new CA: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	e := newEnv(t, envOpts{})
	base := func() certservice.Config {
		return certservice.Config{Authority: e.authority, Authenticator: e.srvAuth(t), Listen: "127.0.0.1:0"}
	}
	tests := []struct {
		name string
		mod  func(*certservice.Config)
	}{
		{"no authority", func(c *certservice.Config) { c.Authority = nil }},
		{"no authenticator", func(c *certservice.Config) { c.Authenticator = nil }},
		{"no listen", func(c *certservice.Config) { c.Listen = "" }},
		{"negative rate", func(c *certservice.Config) { c.RateLimit = -1 }},
		{"negative burst", func(c *certservice.Config) { c.RateBurst = -1 }},
		{"negative serving TTL", func(c *certservice.Config) { c.ServingTTL = -time.Second }},
		{"header list over 64 KiB", func(c *certservice.Config) { c.MaxHeaderListSize = certservice.DefaultMaxHeaderListSize + 1 }},
		{"token limit over 16 KiB", func(c *certservice.Config) { c.MaxTokenSize = authn.MaxTokenSize + 1 }},
		{"negative token limit", func(c *certservice.Config) { c.MaxTokenSize = -1 }},
		{"negative connection limit", func(c *certservice.Config) { c.MaxConnections = -1 }},
		{"negative per-IP connection limit", func(c *certservice.Config) { c.MaxConnectionsPerIP = -1 }},
		{"negative first-request timeout", func(c *certservice.Config) { c.FirstRequestTimeout = -time.Second }},
		{"negative stream workers", func(c *certservice.Config) { c.StreamWorkers = -1 }},
		{"stream workers over the maximum", func(c *certservice.Config) { c.StreamWorkers = certservice.MaxStreamWorkers + 1 }},
	}
	// The fixture itself is accepted, so each case is refused for its own
	// change and not for a defect they share.
	if _, err := certservice.New(base()); err != nil {
		t.Fatalf("the base configuration is refused: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mod(&cfg)
			if _, err := certservice.New(cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	// A taken address fails Listen with an error naming it.
	cfg := base()
	cfg.Listen = e.addr
	s, err := certservice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err == nil || !strings.Contains(err.Error(), e.addr) {
		t.Fatalf("Listen on a taken address: %v", err)
	}
	if _, _, err := net.SplitHostPort(e.addr); err != nil {
		t.Fatal(err)
	}
}

func TestCode(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{ca.Errorf(ca.KindInvalidArgument, "x"), codes.InvalidArgument},
		{ca.Errorf(ca.KindPermissionDenied, "x"), codes.PermissionDenied},
		{ca.Errorf(ca.KindUnauthenticated, "x"), codes.Unauthenticated},
		{ca.Errorf(ca.KindUnavailable, "x"), codes.Unavailable},
		{ca.Errorf(ca.KindResourceExhausted, "x"), codes.ResourceExhausted},
		{ca.Errorf(ca.KindInternal, "x"), codes.Internal},
		{errors.Join(errors.New("wrapped"), ca.Errorf(ca.KindPermissionDenied, "x")), codes.PermissionDenied},
		{errors.New("plain"), codes.Internal},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
	}
	for _, tc := range tests {
		if got := certservice.Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
