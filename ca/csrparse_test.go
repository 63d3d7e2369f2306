package ca_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// checkFastMatchesX509 fails t when the hand-written CSR parser accepts der
// while x509.ParseCertificateRequest refuses it, or reads other values
// than x509 does (Subject and Attributes aside: the fast parser leaves
// them empty and CSR.Request fills them). It reports whether the fast
// parser accepted der.
func checkFastMatchesX509(t testing.TB, der []byte) bool {
	t.Helper()
	fast, ok := ca.ParseCSRFast(der)
	if !ok {
		return false
	}
	ref, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatalf("the fast parser accepts a CSR that x509 refuses (%v):\n%x", err, der)
	}
	ref.Subject, ref.Attributes = pkix.Name{}, nil
	if !reflect.DeepEqual(fast, ref) {
		t.Fatalf("the fast parser reads another CSR than x509:\n got %+v\nwant %+v\nDER %x", fast, ref, der)
	}
	return true
}

// TestParseCSRFastMatchesX509 is the differential test of ca/csrparse.go:
// over the fuzz corpus, generated CSRs (RSA, ECDSA P-256/P-384/P-521,
// Ed25519; subjects of several string types; extensions, attributes and
// signature algorithms the fast parser knows and ones it hands to x509),
// hand-made edge cases and every truncation and single-bit flip of them,
// the fast parser never accepts what x509 refuses and always reads what
// x509 reads. The usual CSRs must take the fast path, or the test would
// pass by never using it.
func TestParseCSRFastMatchesX509(t *testing.T) {
	var corpus [][]byte
	add := func(pemOrDER []byte) {
		if b, _ := pem.Decode(pemOrDER); b != nil {
			corpus = append(corpus, b.Bytes)
		}
		corpus = append(corpus, pemOrDER)
	}
	for _, s := range fuzzSeeds(t) {
		add(s)
	}
	for _, s := range fuzzCorpusFiles(t, "FuzzParseAndCheckCSR") {
		add(s)
	}
	fastWanted := generatedCSRs(t)
	for _, der := range fastWanted {
		if !checkFastMatchesX509(t, der) {
			ref, err := x509.ParseCertificateRequest(der)
			t.Errorf("a usual CSR did not take the fast path (x509: %v, subject %v)", err, ref.Subject)
		}
		// Request fills what the fast parser leaves out: it is x509's CSR.
		csr, err := ca.ParseCSR(certs.EncodeCSR(der))
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := x509.ParseCertificateRequest(der)
		if got := csr.Request(); !reflect.DeepEqual(got, ref) {
			t.Errorf("Request() = %+v, want x509's %+v", got, ref)
		}
	}
	corpus = append(corpus, fastWanted...)
	corpus = append(corpus, slowCSRs(t)...)
	edges := edgeCSRs(t, fastWanted[0])
	corpus = append(corpus, edges...)
	// Hand-made CSRs at the edges of what the fast parser takes must take
	// it too: a parser that gave up on them would still agree with x509
	// (it hands them over), so only this notices it narrowing.
	for _, der := range fastEdgeCSRs(t, fastWanted[0]) {
		if !checkFastMatchesX509(t, der) {
			t.Errorf("an edge CSR that x509 accepts did not take the fast path:\n%x", der)
		}
		corpus = append(corpus, der)
	}

	fast, total := 0, 0
	for _, der := range corpus {
		mutations := [][]byte{der}
		for n := range len(der) {
			mutations = append(mutations, der[:n])
		}
		for i := range len(der) {
			m := bytes.Clone(der)
			m[i] ^= 1 << (i % 8)
			mutations = append(mutations, m)
		}
		for _, m := range mutations {
			total++
			if checkFastMatchesX509(t, m) {
				fast++
			}
		}
	}
	t.Logf("%d inputs (%d base, mutations included), %d taken by the fast parser", total, len(corpus), fast)
	if fast <= len(fastWanted) {
		t.Errorf("only %d inputs took the fast path: the mutations never exercise it", fast)
	}
}

// generatedCSRs are CSRs of the usual shape, which the fast parser must
// take: every allowed key type, SHA-2 signatures, subjects of printable,
// UTF-8 and IA5 strings, URI SANs, basicConstraints and other extensions,
// and other attributes beside the extension request.
func generatedCSRs(t *testing.T) [][]byte {
	id := callerID.String()
	basicCA, _ := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{true})
	other := pkix.Extension{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Critical: true, Value: []byte{0x05, 0x00}}
	challenge := []pkix.AttributeTypeAndValueSET{{
		Type:  asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 7}, // challengePassword
		Value: [][]pkix.AttributeTypeAndValue{{{Type: asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 7}, Value: "secret"}}},
	}}
	type gen struct {
		key   crypto.Signer
		alg   x509.SignatureAlgorithm
		tmpl  x509.CertificateRequest
		istio bool
	}
	ec256, ec384 := mustKey(t, certs.ECP256), mustKey(t, certs.ECP384)
	rsa2048, ed := mustKey(t, certs.RSA2048), mustKey(t, certs.Ed25519)
	uri := func(s string) x509.CertificateRequest {
		pemCSR, _ := mkCSR(t, csrSpec{uris: []string{s}})
		r, _ := x509.ParseCertificateRequest(pemBytes(t, pemCSR))
		return x509.CertificateRequest{URIs: r.URIs}
	}
	gens := []gen{
		{key: ec256},
		{key: ec256, tmpl: uri(id)},
		{key: ec256, istio: true},
		{key: ec384, tmpl: uri(id)},
		{key: ec384, alg: x509.ECDSAWithSHA512, tmpl: uri(id)},
		{key: rsa2048, tmpl: uri(id)},
		{key: rsa2048, alg: x509.SHA384WithRSA, tmpl: uri(id)},
		{key: rsa2048, alg: x509.SHA512WithRSA},
		{key: ed, tmpl: uri(id)},
		{key: ec256, tmpl: x509.CertificateRequest{Subject: pkix.Name{CommonName: "workload", Organization: []string{"é-utf8", "Print*&"}, Country: []string{"FR"}}}},
		{key: ec256, tmpl: x509.CertificateRequest{ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: basicCA}, other}}},
		{key: ec256, tmpl: x509.CertificateRequest{Attributes: challenge}},
		{key: ec256, tmpl: uri("spiffe://cluster.local/ns/a%20b/sa/x?q#f")},
		{key: ec256, tmpl: uri("spiffe://host.with.dots:8080/p")},
		{key: ec256, tmpl: uri("urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66")},
	}
	var out [][]byte
	for _, g := range gens {
		tmpl := g.tmpl
		tmpl.SignatureAlgorithm = g.alg
		if g.istio {
			p := istioCSR(t, g.key, id, false)
			out = append(out, pemBytes(t, p))
			continue
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, g.key)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, der)
	}
	return out
}

// slowCSRs are valid CSRs the fast parser hands to x509: other key types
// and signature algorithms, other SAN types, other string types.
func slowCSRs(t *testing.T) [][]byte {
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, c := range []struct {
		key  crypto.Signer
		tmpl x509.CertificateRequest
	}{
		{p521, x509.CertificateRequest{}},
		{mustKey(t, certs.RSA2048), x509.CertificateRequest{SignatureAlgorithm: x509.SHA256WithRSAPSS}},
		{mustKey(t, certs.ECP256), x509.CertificateRequest{DNSNames: []string{"a.example"}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}, EmailAddresses: []string{"x@y.example"}}},
		{mustKey(t, certs.ECP256), x509.CertificateRequest{Subject: pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: asn1.ObjectIdentifier{2, 5, 4, 3}, Value: 42}}}}},
	} {
		der, err := x509.CreateCertificateRequest(rand.Reader, &c.tmpl, c.key)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, der)
	}
	return out
}

// edgeCSRs rebuilds base with one part changed at a time, for the cases
// where encoding/asn1 and a hand-written reader could disagree: other
// versions, extra fields, parameters on the signature algorithm, string
// types, duplicate or repeated extension requests, explicit FALSE
// criticality, non-URI names, padding bits.
func edgeCSRs(t *testing.T, base []byte) [][]byte {
	p := splitCSR(t, base)
	null := []byte{0x05, 0x00}
	seq := func(parts ...[]byte) []byte { return tlv(0x30, bytes.Join(parts, nil)) }
	set := func(parts ...[]byte) []byte { return tlv(0x31, bytes.Join(parts, nil)) }
	oid := func(arcs ...int) []byte { d, _ := asn1.Marshal(asn1.ObjectIdentifier(arcs)); return d }
	extReq := oid(1, 2, 840, 113549, 1, 9, 14)
	san := oid(2, 5, 29, 17)
	uriSAN := tlv(0x04, seq(tlv(0x86, []byte(callerID.String()))))
	ext := func(id []byte, rest ...[]byte) []byte { return seq(append([][]byte{id}, rest...)...) }
	attr := func(id []byte, values ...[]byte) []byte { return seq(id, set(values...)) }
	reqOf := func(exts ...[]byte) []byte { return attr(extReq, seq(exts...)) }
	atv := func(tag byte, v string) []byte { return set(seq(oid(2, 5, 4, 10), tlv(tag, []byte(v)))) }

	var out [][]byte
	build := func(mut func(*csrParts)) {
		q := p
		mut(&q)
		out = append(out, q.der())
	}
	build(func(q *csrParts) { q.version = []byte{0x02, 0x01, 0x01} })
	build(func(q *csrParts) { q.version = []byte{0x02, 0x01, 0xff} })
	build(func(q *csrParts) { q.version = []byte{0x02, 0x02, 0x00, 0x00} })
	build(func(q *csrParts) { q.tbsExtra = []byte{0x05, 0x00} })
	build(func(q *csrParts) { q.outerExtra = []byte{0x05, 0x00} })
	build(func(q *csrParts) { q.sigAlg = seq(q.sigAlgOID, null) })
	build(func(q *csrParts) { q.sigAlg = seq(q.sigAlgOID, null, null) })
	build(func(q *csrParts) { q.sigAlg = seq(q.sigAlgOID, tlv(0x04, nil)) })
	build(func(q *csrParts) { q.sigAlg = seq(oid(1, 3, 101, 112), null) })
	build(func(q *csrParts) { q.sigAlg = seq(oid(1, 2, 840, 113549, 1, 1, 5)) })
	build(func(q *csrParts) { q.sigBits = append([]byte{0x01}, q.sigBits[1:]...) })
	for _, s := range [][]byte{
		seq(), seq(set()), seq(atv(0x13, "ok")), seq(atv(0x13, "bad!")), seq(atv(0x13, "a*b&c")),
		seq(atv(0x0c, "é")), seq(atv(0x0c, "\xff")), seq(atv(0x16, "ia5")), seq(atv(0x16, "\x80")),
		seq(atv(0x14, "t61")), seq(atv(0x1e, "\x00a")), seq(atv(0x1e, "\x00")), seq(atv(0x12, "12 3")), seq(atv(0x12, "x")),
		seq(set(seq(oid(2, 5, 4, 10)))), seq(set(seq(oid(2, 5, 4, 10), tlv(0x13, nil), null))),
		seq(set(seq(tlv(0x06, nil), tlv(0x13, nil)))), seq(set(seq(oid(2, 5, 4, 10), tlv(0x33, nil)))),
		set(), tlv(0x13, []byte("x")),
	} {
		build(func(q *csrParts) { q.subject = s })
	}
	for _, a := range [][]byte{
		nil,
		reqOf(),
		reqOf(ext(san, uriSAN)),
		reqOf(ext(san, tlv(0x01, []byte{0x00}), uriSAN)),
		reqOf(ext(san, tlv(0x01, []byte{0xff}), uriSAN)),
		reqOf(ext(san, tlv(0x01, []byte{0x01}), uriSAN)),
		reqOf(ext(san, uriSAN, null)),
		reqOf(ext(san, uriSAN), ext(san, uriSAN)),
		reqOf(ext(oid(1, 2, 3), tlv(0x04, nil)), ext(oid(1, 2, 3), tlv(0x04, nil))),
		bytes.Join([][]byte{reqOf(ext(oid(1, 2, 3), tlv(0x04, nil))), reqOf(ext(oid(1, 2, 4), tlv(0x04, nil)))}, nil),
		bytes.Join([][]byte{reqOf(ext(san, uriSAN)), reqOf(ext(san, uriSAN))}, nil),
		attr(extReq),
		attr(extReq, seq(ext(san, uriSAN)), seq()),
		seq(extReq, set(seq(ext(san, uriSAN))), null),
		seq(extReq, tlv(0x30, seq(ext(san, uriSAN)))),
		attr(extReq, set()),
		attr(oid(1, 2, 840, 113549, 1, 9, 7), tlv(0x0c, []byte("pw"))),
		attr(oid(1, 2, 840, 113549, 1, 9, 7)),
		seq(tlv(0x06, nil), set(null)),
		tlv(0x05, nil),
		seq(null),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x82, []byte("a.example")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x87, []byte{1, 2, 3}))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0xa0, nil))))),
		reqOf(ext(san, tlv(0x04, append(seq(tlv(0x86, []byte("spiffe://a/b"))), 0x00)))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://a..b/c")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://a./c")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://a%20b/c")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://é/c")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("%zz")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://[::1]/c")))))),
		reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("//a/b")))))),
		reqOf(ext(san, tlv(0x04, seq()))),
	} {
		build(func(q *csrParts) { q.attrs = a })
	}
	edKey := bytes.Repeat([]byte{7}, 32)
	bits := func(b []byte) []byte { return tlv(0x03, append([]byte{0}, b...)) }
	var point cryptobyte.String
	ecSPKI := cryptobyte.String(p.spki)
	if !ecSPKI.ReadASN1(&ecSPKI, cbasn1.SEQUENCE) || !ecSPKI.SkipASN1(cbasn1.SEQUENCE) || !ecSPKI.ReadASN1(&point, cbasn1.BIT_STRING) {
		t.Fatal("cannot split the key")
	}
	rsaKey := seq(tlv(0x02, append([]byte{0x00, 0xc1}, bytes.Repeat([]byte{0x55}, 255)...)), tlv(0x02, []byte{1, 0, 1}))
	rsaOID, ecOID, edOID := oid(1, 2, 840, 113549, 1, 1, 1), oid(1, 2, 840, 10045, 2, 1), oid(1, 3, 101, 112)
	for _, k := range [][]byte{
		seq(seq(edOID), bits(edKey)),
		seq(seq(edOID, null), bits(edKey)),
		seq(seq(edOID), bits(edKey[:31])),
		seq(seq(edOID), bits(edKey), null),
		seq(seq(rsaOID, null), bits(rsaKey)),
		seq(seq(rsaOID), bits(rsaKey)),
		seq(seq(rsaOID, null), bits(append(bytes.Clone(rsaKey), 0x05, 0x00))),
		seq(seq(rsaOID, null), bits(seq(tlv(0x02, []byte{0x01}), tlv(0x02, []byte{0x00})))),
		seq(seq(rsaOID, null), bits(seq(tlv(0x02, []byte{0xff}), tlv(0x02, []byte{0x03})))),
		seq(seq(ecOID, oid(1, 3, 132, 0, 35)), tlv(0x03, point)),
		seq(seq(ecOID, oid(1, 2, 840, 10045, 3, 1, 7)), tlv(0x03, point)),
		seq(seq(ecOID, oid(1, 3, 132, 0, 34)), tlv(0x03, point)),
		seq(seq(ecOID), tlv(0x03, point)),
		seq(seq(ecOID, oid(1, 2, 840, 10045, 3, 1, 7)), tlv(0x03, append([]byte{0, 0x02}, point[2:34]...))),
		seq(seq(oid(1, 2, 840, 10040, 4, 1)), bits(tlv(0x02, []byte{5}))),
	} {
		build(func(q *csrParts) { q.spki = k })
	}
	build(func(q *csrParts) { q.noAttrs = true })
	build(func(q *csrParts) { q.attrsTag = 0x80 })
	// An RSA modulus of zero; a URI with the first non-IA5 byte; a URI
	// host with an empty first label.
	build(func(q *csrParts) {
		q.spki = seq(seq(rsaOID, null), bits(seq(tlv(0x02, []byte{0x00}), tlv(0x02, []byte{1, 0, 1}))))
	})
	build(func(q *csrParts) { q.attrs = reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://a/\x80")))))) })
	build(func(q *csrParts) { q.attrs = reqOf(ext(san, tlv(0x04, seq(tlv(0x86, []byte("spiffe://.a/c")))))) })
	return out
}

// fastEdgeCSRs rebuilds base (a usual CSR) with parts that x509 accepts
// at the edge of each character class the fast parser checks by hand:
// every boundary character of PrintableString, IA5String up to 0x7f, and
// URI hosts with the lowest and highest characters x509 allows (33 '!'
// and 126 '~') and a first label of two characters. The signature no longer verifies; parsing does not check
// it.
func fastEdgeCSRs(t *testing.T, base []byte) [][]byte {
	p := splitCSR(t, base)
	seq := func(parts ...[]byte) []byte { return tlv(0x30, bytes.Join(parts, nil)) }
	set := func(parts ...[]byte) []byte { return tlv(0x31, bytes.Join(parts, nil)) }
	oid := func(arcs ...int) []byte { d, _ := asn1.Marshal(asn1.ObjectIdentifier(arcs)); return d }
	atv := func(tag byte, v string) []byte { return set(seq(oid(2, 5, 4, 10), tlv(tag, []byte(v)))) }
	uriReq := func(uri string) []byte {
		san := seq(oid(2, 5, 29, 17), tlv(0x04, seq(tlv(0x86, []byte(uri)))))
		return seq(oid(1, 2, 840, 113549, 1, 9, 14), set(seq(san)))
	}
	var out [][]byte
	for _, q := range []func(*csrParts){
		func(q *csrParts) { q.subject = seq(atv(0x13, "azAZ09'()+,-./ :=?*&")) },
		func(q *csrParts) { q.subject = seq(atv(0x16, "\x00ia5\x7f")) },
		func(q *csrParts) { q.attrs = uriReq("spiffe://a!.b~c/p") },
	} {
		r := p
		q(&r)
		out = append(out, r.der())
	}
	return out
}

// csrParts is a CSR taken apart, to be rebuilt with one part changed.
type csrParts struct {
	version, subject, spki, attrs, tbsExtra []byte
	attrsTag                                byte
	noAttrs                                 bool
	sigAlgOID, sigAlg, sigBits, outerExtra  []byte
}

func splitCSR(t *testing.T, der []byte) csrParts {
	in := cryptobyte.String(der)
	var outer, tbs, sigAlg, sigBits, version, subject, spki, attrs, oid cryptobyte.String
	if !in.ReadASN1(&outer, cbasn1.SEQUENCE) || !outer.ReadASN1(&tbs, cbasn1.SEQUENCE) ||
		!outer.ReadASN1Element(&sigAlg, cbasn1.SEQUENCE) || !outer.ReadASN1(&sigBits, cbasn1.BIT_STRING) ||
		!tbs.ReadASN1Element(&version, cbasn1.INTEGER) || !tbs.ReadASN1Element(&subject, cbasn1.SEQUENCE) ||
		!tbs.ReadASN1Element(&spki, cbasn1.SEQUENCE) || !tbs.ReadASN1(&attrs, cbasn1.Tag(0).Constructed().ContextSpecific()) {
		t.Fatal("cannot split the CSR")
	}
	algBody := sigAlg
	if !algBody.ReadASN1(&algBody, cbasn1.SEQUENCE) || !algBody.ReadASN1Element(&oid, cbasn1.OBJECT_IDENTIFIER) {
		t.Fatal("cannot split the signature algorithm")
	}
	return csrParts{version: version, subject: subject, spki: spki, attrs: attrs, attrsTag: 0xa0,
		sigAlgOID: oid, sigAlg: sigAlg, sigBits: sigBits}
}

func (p csrParts) der() []byte {
	tbs := bytes.Join([][]byte{p.version, p.subject, p.spki}, nil)
	if !p.noAttrs {
		tbs = append(tbs, tlv(p.attrsTag, p.attrs)...)
	}
	tbs = append(tbs, p.tbsExtra...)
	return tlv(0x30, bytes.Join([][]byte{tlv(0x30, tbs), p.sigAlg, tlv(0x03, p.sigBits), p.outerExtra}, nil))
}

// tlv encodes one DER element with a low tag number.
func tlv(tag byte, content []byte) []byte {
	b := cryptobyte.NewBuilder(nil)
	b.AddASN1(cbasn1.Tag(tag), func(b *cryptobyte.Builder) { b.AddBytes(content) })
	return b.BytesOrPanic()
}

// pemBytes returns the DER of a one-block PEM.
func pemBytes(t testing.TB, p []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(p)
	if b == nil {
		t.Fatal("not PEM")
	}
	return b.Bytes
}

// fuzzCorpusFiles returns the inputs in testdata/fuzz/<name> (the corpus
// `go test -fuzz` writes failures to), each file in the "go test fuzz v1"
// format with one []byte value.
func fuzzCorpusFiles(t *testing.T, name string) [][]byte {
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", name, "*"))
	var out [][]byte
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if q, ok := strings.CutPrefix(strings.TrimSpace(line), "[]byte("); ok {
				s, err := strconv.Unquote(strings.TrimSuffix(q, ")"))
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				out = append(out, []byte(s))
			}
		}
	}
	return out
}

// BenchmarkParseCSRDER compares the hand-written CSR parser with
// x509.ParseCertificateRequest on an istio-agent CSR (P-256, a subject
// with an empty Organization, one URI SAN); the signature check, the same
// for both, is left out.
func BenchmarkParseCSRDER(b *testing.B) {
	der := pemBytes(b, istioCSR(b, mustKey(b, certs.ECP256), callerID.String(), false))
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := ca.ParseCSRFast(der); !ok {
				b.Fatal("not taken by the fast parser")
			}
		}
	})
	b.Run("x509", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := x509.ParseCertificateRequest(der); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// rsaCSRWithJunkSignature builds the DER-in-PEM of a CSR whose RSA public
// key has a random modulus of the given bits and exponent e, signed with
// random bytes the size of the modulus. Nobody holds its private key (none
// need exist): checking its signature costs a modular exponentiation with
// that modulus and exponent, which is what an attacker pays nothing for.
func rsaCSRWithJunkSignature(t testing.TB, bits int, e int64) []byte {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), uint(bits)))
	if err != nil {
		t.Fatal(err)
	}
	n.SetBit(n, bits-1, 1).SetBit(n, 0, 1) // exactly bits long, odd
	var pk cryptobyte.Builder
	pk.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1BigInt(n)
		b.AddASN1Int64(e)
	})
	pkDER := pk.BytesOrPanic()
	rsaAlg := func(b *cryptobyte.Builder, oid asn1.ObjectIdentifier) {
		b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
			b.AddASN1ObjectIdentifier(oid)
			b.AddASN1NULL()
		})
	}
	var info cryptobyte.Builder
	info.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1Int64(0)
		b.AddASN1(cbasn1.SEQUENCE, func(*cryptobyte.Builder) {}) // empty subject
		b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
			rsaAlg(b, asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1})
			b.AddASN1BitString(pkDER)
		})
		b.AddASN1(cbasn1.Tag(0).Constructed().ContextSpecific(), func(*cryptobyte.Builder) {})
	})
	sig := make([]byte, (bits+7)/8)
	if _, err := rand.Read(sig); err != nil {
		t.Fatal(err)
	}
	sig[0] = 0 // below the modulus, so it reaches the exponentiation
	var csr cryptobyte.Builder
	csr.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddBytes(info.BytesOrPanic())
		rsaAlg(b, asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 11})
		b.AddASN1BitString(sig)
	})
	der := csr.BytesOrPanic()
	if _, err := x509.ParseCertificateRequest(der); err != nil {
		t.Fatalf("crafted CSR does not parse: %v", err)
	}
	return certs.EncodeCSR(der)
}

// costlyCSRs are CSRs that used to cost seconds of CPU before being
// refused: the attack of issue 9, hole 3 (a 61 KB CSR with a
// 180,000-bit modulus cost 2.6 s), and its variants.
func costlyCSRs(t testing.TB) []struct {
	name string
	pem  []byte
	want string
} {
	return []struct {
		name string
		pem  []byte
		want string
	}{
		{"rsa-180000-bits", rsaCSRWithJunkSignature(t, 180000, 65537), "RSA key of 180000 bits not allowed"},
		{"rsa-16384-bits", rsaCSRWithJunkSignature(t, 16384, 65537), "RSA key of 16384 bits not allowed"},
		{"rsa-exponent-2^31-1", rsaCSRWithJunkSignature(t, 2048, 1<<31-1), "RSA public exponent 2147483647 not allowed"},
		{"rsa-exponent-3", rsaCSRWithJunkSignature(t, 2048, 3), "RSA public exponent 3 not allowed"},
	}
}

// TestParseCSRRefusesCostlyKeysBeforeTheSignature: the key's type, size
// and exponent are refused before its signature is checked, so the
// refusal names the key, not the signature. (On b96f7b0 the signature was
// checked first: these CSRs were refused as "signature does not verify",
// the 180,000-bit one after seconds of CPU.) The refused CSR never
// reaches a real Authority; a CSR with the same key passed to VerifyCSR
// is refused the same way.
func TestParseCSRRefusesCostlyKeysBeforeTheSignature(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	for _, tc := range costlyCSRs(t) {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.pem) > ca.MaxCSRSize {
				t.Fatalf("the attack CSR is %d bytes, over the size limit: it tests nothing", len(tc.pem))
			}
			_, err := parseAndSign(a, tc.pem, callerID, 0)
			if ca.KindOf(err) != ca.KindInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseCSR = %v, want invalid_argument %q", err, tc.want)
			}
		})
	}
}

// BenchmarkRefusedCSR measures the CPU a refused CSR costs the CA, for the
// costliest refusals there are: the keys an attacker would pick, the
// largest key the policy allows with a bad signature, and a CSR of the
// maximum size. Target (issue 9): under 5 ms of CPU each.
func BenchmarkRefusedCSR(b *testing.B) {
	cases := costlyCSRs(b)
	cases = append(cases, struct {
		name string
		pem  []byte
		want string
	}{"rsa-8192-bad-signature", rsaCSRWithJunkSignature(b, ca.MaxRSABits, 65537), "signature does not verify"})
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if _, err := ca.ParseCSR(tc.pem); err == nil || !strings.Contains(err.Error(), tc.want) {
					b.Fatalf("ParseCSR = %v, want %q", err, tc.want)
				}
			}
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			}
		})
	}
}
