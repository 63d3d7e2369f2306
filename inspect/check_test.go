package inspect_test

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/inspect"
)

func chainInput(name string, cs ...*x509.Certificate) *inspect.Input {
	return &inspect.Input{Name: name, Origin: inspect.OriginFile, Certs: cs}
}

// constrained makes an intermediate under root whose name constraints
// permit only URIs in domain.
func constrained(t *testing.T, root authority, domain string) authority {
	t.Helper()
	k := newKey(t)
	serial, _ := certs.NewSerial()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "Constrained CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
		PermittedURIDomains: []string{domain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.cert, k.Public(), root.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return authority{c, k}
}

func TestCheckFailures(t *testing.T) {
	m := newMesh(t)
	roots := []*x509.Certificate{m.root.cert}
	base := inspect.Options{Now: now, Roots: roots, RootsName: "roots.pem"}
	otherKey := newKey(t)
	sameName := newRoot(t, m.root.cert.Subject, now.Add(-time.Hour), 24*time.Hour)
	otherRoot := newRoot(t, pkix.Name{CommonName: "Other Root"}, now.Add(-time.Hour), 24*time.Hour)
	sameNameInter := sameName.intermediate(t, m.inter.cert.Subject, now.Add(-time.Hour), 24*time.Hour, 0)
	tdRoot := newRoot(t, pkix.Name{CommonName: "TD Root"}, now.Add(-time.Hour), 24*time.Hour)
	tdRoot.cert.URIs = []*url.URL{{Scheme: "spiffe", Host: "other.domain"}} // only Check reads it
	subInter := m.inter.intermediate(t, pkix.Name{CommonName: "Too Deep CA"}, now.Add(-time.Hour), 24*time.Hour, 0)
	deepLeaf, _ := subInter.leaf(t, workload, now.Add(-time.Minute), time.Hour, nil)
	leafAsCA := authority{m.leaf, m.leafKey}
	underLeaf, _ := leafAsCA.leaf(t, workload, now.Add(-time.Minute), time.Hour, nil)
	cons := constrained(t, m.root, "example.org")
	consLeaf, _ := cons.leaf(t, workload, now.Add(-time.Minute), time.Hour, nil)
	shortRoot := newRoot(t, pkix.Name{CommonName: "Short Root"}, now.Add(-48*time.Hour), 24*time.Hour)
	longLeaf, _ := shortRoot.leaf(t, workload, now.Add(-47*time.Hour), 72*time.Hour, nil)
	leafWith := func(id string, mutate func(*x509.Certificate)) *x509.Certificate {
		c, _ := m.inter.leaf(t, id, now.Add(-time.Minute), time.Hour, mutate)
		return c
	}

	tests := []struct {
		name    string
		inputs  []*inspect.Input
		opts    inspect.Options
		want    []inspect.Code
		wantMsg string
	}{
		{"valid", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)}, base, nil, ""},
		{"expired", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now.Add(13 * time.Hour), Roots: roots, RootsName: "r"},
			[]inspect.Code{inspect.CodeExpired}, "expired at 2026-06-01T23:58:00Z (1h2m ago)"},
		{"not yet valid", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now.Add(-time.Hour), Roots: roots, RootsName: "r"},
			[]inspect.Code{inspect.CodeNotYetValid}, "becomes valid at 2026-06-01T11:58:00Z"},
		{"unknown issuer", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now, Roots: []*x509.Certificate{otherRoot.cert}, RootsName: "other.pem"},
			[]inspect.Code{inspect.CodeUnknownIssuer}, `was issued by "CN=Root CA,O=meshid", which does not chain to the trusted roots in other.pem`},
		{"unknown issuer, same name", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now, Roots: []*x509.Certificate{sameName.cert}, RootsName: "r"},
			[]inspect.Code{inspect.CodeUnknownIssuer}, "a different CA with the same name?"},
		{"included root not trusted", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert, m.root.cert)},
			inspect.Options{Now: now, Roots: []*x509.Certificate{otherRoot.cert}, RootsName: "r"},
			[]inspect.Code{inspect.CodeUnknownIssuer}, `root "CN=Root CA,O=meshid" is not one of the trusted roots in r`},
		{"wrong intermediate, same name", []*inspect.Input{chainInput("a", m.leaf, sameNameInter.cert)}, base,
			[]inspect.Code{inspect.CodeUnknownIssuer}, "is not signed by the next certificate in the chain"},
		{"name mismatch: chain order", []*inspect.Input{chainInput("a", m.leaf, m.root.cert, m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeNameMismatch, inspect.CodeNameMismatch}, `names its issuer "CN=Intermediate CA,O=meshid,L=west", but the next certificate in the chain is root "CN=Root CA,O=meshid"`},
		{"name mismatch: trust domain", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now, Roots: roots, RootsName: "r", TrustDomain: spiffeid.RequireTrustDomainFromString("prod.example")},
			[]inspect.Code{inspect.CodeNameMismatch}, `is in trust domain "cluster.local", want "prod.example"`},
		{"name mismatch: roots for another trust domain", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now, Roots: append([]*x509.Certificate{tdRoot.cert}, roots...), RootsName: "r"},
			[]inspect.Code{inspect.CodeNameMismatch}, `but the roots in r are for "other.domain"`},
		{"name mismatch: name constraints", []*inspect.Input{chainInput("a", consLeaf, cons.cert)}, base,
			[]inspect.Code{inspect.CodeNameMismatch}, "name constraints do not permit leaf"},
		{"key mismatch", []*inspect.Input{{Name: "a", Certs: []*x509.Certificate{m.leaf, m.inter.cert}, Key: otherKey}}, base,
			[]inspect.Code{inspect.CodeKeyMismatch}, "does not match leaf spiffe://cluster.local/ns/default/sa/default"},
		{"non-SPIFFE: no URI", []*inspect.Input{chainInput("a", leafWith("", func(c *x509.Certificate) { c.DNSNames = []string{"web.example"} }), m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeNotSPIFFE}, "leaf DNS:web.example is not a SPIFFE leaf: it has DNS SANs and no URI SAN (a gateway certificate? --allow-dns accepts it)"},
		{"DNS leaf with AllowDNS", []*inspect.Input{chainInput("a", leafWith("", func(c *x509.Certificate) { c.DNSNames = []string{"web.example"} }), m.inter.cert)},
			inspect.Options{Now: now, Roots: roots, RootsName: "roots.pem", AllowDNS: true}, nil, ""},
		{"AllowDNS still verifies the chain", []*inspect.Input{chainInput("a", leafWith("", func(c *x509.Certificate) { c.DNSNames = []string{"web.example"} }), m.inter.cert)},
			inspect.Options{Now: now, Roots: []*x509.Certificate{otherRoot.cert}, RootsName: "other.pem", AllowDNS: true}, []inspect.Code{inspect.CodeUnknownIssuer}, ""},
		{"AllowDNS: no SANs at all", []*inspect.Input{chainInput("a", leafWith("", nil), m.inter.cert)},
			inspect.Options{Now: now, Roots: roots, RootsName: "roots.pem", AllowDNS: true}, []inspect.Code{inspect.CodeNotSPIFFE}, "it has no URI SAN, so no SPIFFE ID"},
		{"non-SPIFFE: two URIs", []*inspect.Input{chainInput("a", leafWith(workload, func(c *x509.Certificate) { c.URIs = append(c.URIs, c.URIs[0]) }), m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeNotSPIFFE}, "it has 2 URI SANs"},
		{"non-SPIFFE: https URI", []*inspect.Input{chainInput("a", leafWith("https://example.com/x", nil), m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeNotSPIFFE}, `URI SAN "https://example.com/x" is not a SPIFFE ID`},
		{"non-SPIFFE: no digital signature", []*inspect.Input{chainInput("a", leafWith(workload, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageKeyEncipherment }), m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeNotSPIFFE}, "lacks Digital Signature"},
		{"non-SPIFFE: cert sign", []*inspect.Input{chainInput("a", leafWith(workload, func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageCertSign }), m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeNotSPIFFE}, "includes Cert Sign"},
		{"expiring", []*inspect.Input{chainInput("a", m.leaf, m.inter.cert)},
			inspect.Options{Now: now, Roots: roots, RootsName: "r", ExpiresWithin: 24 * time.Hour},
			[]inspect.Code{inspect.CodeExpiring}, "expires at 2026-06-01T23:58:00Z, in 11h58m, within 24h"},
		{"path length exceeded", []*inspect.Input{chainInput("a", deepLeaf, subInter.cert, m.inter.cert)}, base,
			[]inspect.Code{inspect.CodeInvalid}, `path length constraint exceeded: intermediate "CN=Intermediate CA,O=meshid,L=west" allows at most 0`},
		{"issuer is not a CA", []*inspect.Input{chainInput("a", underLeaf, m.leaf)}, base,
			[]inspect.Code{inspect.CodeInvalid}, "it is not a CA"},
		{"trusted root expired", []*inspect.Input{chainInput("a", longLeaf)},
			inspect.Options{Now: now, Roots: []*x509.Certificate{shortRoot.cert}, RootsName: "r"},
			[]inspect.Code{inspect.CodeExpired}, `trusted root "CN=Short Root" in r expired at`},
		{"bundle root not in --roots", []*inspect.Input{{Name: "root-cert.pem", Certs: []*x509.Certificate{otherRoot.cert}, Bundle: true}}, base,
			[]inspect.Code{inspect.CodeUnknownIssuer}, `root "CN=Other Root" is not one of the trusted roots in roots.pem`},
		{"bundle with a leaf", []*inspect.Input{{Name: "ca.crt", Certs: []*x509.Certificate{m.leaf}, Bundle: true}}, inspect.Options{Now: now},
			[]inspect.Code{inspect.CodeInvalid}, "is in a trust bundle but is not a CA"},
		{"signing CA key mismatch", []*inspect.Input{{Name: "ca-cert.pem", Certs: []*x509.Certificate{m.inter.cert, m.root.cert}, Key: m.root.key, KeyName: "ca-key.pem"}}, base,
			[]inspect.Code{inspect.CodeKeyMismatch}, `private key from ca-key.pem (ec-p256) does not match CA "CN=Intermediate CA,O=meshid,L=west"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := inspect.Check(tc.inputs, tc.opts)
			r := rep.Results[0]
			var got []inspect.Code
			var msgs []string
			for _, p := range r.Problems {
				got = append(got, p.Code)
				msgs = append(msgs, p.Message)
			}
			if strings.Join(codes(got), ",") != strings.Join(codes(tc.want), ",") {
				t.Fatalf("codes = %v, want %v; messages:\n%s", got, tc.want, strings.Join(msgs, "\n"))
			}
			if tc.wantMsg != "" && !strings.Contains(strings.Join(msgs, "\n"), tc.wantMsg) {
				t.Errorf("messages lack %q:\n%s", tc.wantMsg, strings.Join(msgs, "\n"))
			}
			wantValid := len(tc.want) == 0 || (len(tc.want) == 1 && tc.want[0] == inspect.CodeExpiring)
			if r.Valid != wantValid || rep.Valid != wantValid {
				t.Errorf("valid = %t (report %t), want %t", r.Valid, rep.Valid, wantValid)
			}
			wantStatus := inspect.StatusInvalid
			switch {
			case len(tc.want) == 0:
				wantStatus = inspect.StatusOK
			case wantValid:
				wantStatus = inspect.StatusExpiring
			}
			if rep.Status != wantStatus {
				t.Errorf("status = %s, want %s", rep.Status, wantStatus)
			}
		})
	}
}

func codes(cs []inspect.Code) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = string(c)
	}
	return out
}

func TestCheckCSRAndKeys(t *testing.T) {
	m := newMesh(t)
	id := spiffeid.RequireFromString(workload)
	csr, err := certs.NewCSR(m.leafKey, id)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		t.Fatal(err)
	}
	noURI, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"x"}}, m.leafKey)
	if err != nil {
		t.Fatal(err)
	}
	noURIParsed, _ := x509.ParseCertificateRequest(noURI)
	keyIn := &inspect.Input{Name: "tls.key", Key: newKey(t)}
	certIn := chainInput("tls.crt", m.leaf, m.inter.cert)

	tests := []struct {
		name   string
		inputs []*inspect.Input
		want   []inspect.Code
	}{
		{"CSR ok", []*inspect.Input{{Name: "a.csr", CSR: parsed, Key: m.leafKey}}, nil},
		{"CSR key mismatch", []*inspect.Input{{Name: "a.csr", CSR: parsed, Key: newKey(t)}}, []inspect.Code{inspect.CodeKeyMismatch}},
		{"CSR without SPIFFE ID", []*inspect.Input{{Name: "a.csr", CSR: noURIParsed}}, []inspect.Code{inspect.CodeNotSPIFFE}},
		{"lone key", []*inspect.Input{{Name: "k.pem", Key: m.leafKey}}, nil},
		{"paired key mismatch", []*inspect.Input{keyIn, certIn}, []inspect.Code{inspect.CodeKeyMismatch}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inspect.PairKeys(tc.inputs)
			rep := inspect.Check(tc.inputs, inspect.Options{Now: now})
			var got []inspect.Code
			for _, r := range rep.Results {
				for _, p := range r.Problems {
					got = append(got, p.Code)
				}
			}
			if len(tc.want) == 0 && len(got) != 0 {
				t.Fatalf("problems %v, want none: %+v", got, rep.Results)
			}
			for _, w := range tc.want {
				found := false
				for _, g := range got {
					found = found || g == w
				}
				if !found {
					t.Fatalf("problems %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestExpiresIn(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "expired"},
		{0, "expired"},
		{45 * time.Second, "45s"},
		{42*time.Minute + 30*time.Second, "42m"},
		{11*time.Hour + 58*time.Minute, "11h58m"},
		{47*time.Hour + 59*time.Minute, "47h59m"},
		{90*24*time.Hour + 5*time.Hour, "90d5h"},
	}
	for _, tc := range tests {
		if got := inspect.ExpiresIn(tc.d); got != tc.want {
			t.Errorf("ExpiresIn(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// BenchmarkCheck measures checking one workload chain against its root
// and rendering the table, what `meshid inspect --sds` does per resource.
func BenchmarkCheck(b *testing.B) {
	m := newMesh(b)
	in := []*inspect.Input{{Name: "default", Certs: []*x509.Certificate{m.leaf, m.inter.cert}, Key: m.leafKey}}
	opts := inspect.Options{Now: now, Roots: []*x509.Certificate{m.root.cert}, RootsName: "ROOTCA"}
	b.ReportAllocs()
	for b.Loop() {
		rep := inspect.Check(in, opts)
		if !rep.Valid {
			b.Fatal("invalid")
		}
		if err := inspect.WriteTable(io.Discard, rep, false); err != nil {
			b.Fatal(err)
		}
	}
}
