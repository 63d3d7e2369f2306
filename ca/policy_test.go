package ca_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

func TestParseCSRRejects(t *testing.T) {
	good, _ := mkCSR(t, csrSpec{uris: []string{callerID.String()}})
	block, _ := pem.Decode(good)
	badSig := bytes.Clone(block.Bytes)
	badSig[len(badSig)-2] ^= 0xff // inside the signature BIT STRING
	padded := append(bytes.Repeat([]byte(" "), ca.MaxCSRSize), good...)
	certPEM := certs.EncodeCertificates(rootBundle(t, certs.ECP256, t0).Cert)

	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "not PEM"},
		{"garbage", []byte("hello, CA"), "not PEM"},
		{"DER, not PEM", block.Bytes, "not PEM"},
		{"leading junk", append([]byte("junk\n"), good...), "not PEM"},
		{"over 64 KiB", padded, "64 KiB"},
		{"wrong block type", certPEM, `"CERTIFICATE", want CERTIFICATE REQUEST`},
		{"two CSR blocks", append(bytes.Clone(good), good...), "several blocks"},
		{"trailing junk", append(bytes.Clone(good), "junk"...), "trailing data"},
		{"truncated PEM", good[:len(good)-30], "malformed"},
		{"malformed DER", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{0x30, 0x03, 0x02, 0x01, 0x01}}), "CSR is malformed"},
		{"bad signature", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: badSig}), "signature does not verify"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			csr, err := ca.ParseCSR(tc.in)
			if err == nil {
				t.Fatalf("ParseCSR accepted it")
			}
			if csr != nil {
				t.Errorf("ParseCSR returned a CSR with its error")
			}
			if k := ca.KindOf(err); k != ca.KindInvalidArgument {
				t.Errorf("kind %v, want invalid_argument (%v)", k, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
	if _, err := ca.ParseCSR(good); err != nil {
		t.Fatalf("good CSR: %v", err)
	}
	if _, err := ca.ParseCSR(append([]byte("\n  "), append(bytes.Clone(good), "\n\n"...)...)); err != nil {
		t.Fatalf("good CSR with surrounding whitespace: %v", err)
	}
	newCSR := bytes.Replace(good, []byte("CERTIFICATE REQUEST"), []byte("NEW CERTIFICATE REQUEST"), 2)
	if _, err := ca.ParseCSR(newCSR); err != nil {
		t.Fatalf("NEW CERTIFICATE REQUEST block: %v", err)
	}
	// The size limit is inclusive: exactly MaxCSRSize bytes is parsed.
	exact := append(bytes.Repeat([]byte(" "), ca.MaxCSRSize-len(good)), good...)
	if _, err := ca.ParseCSR(exact); err != nil {
		t.Fatalf("a CSR of exactly %d bytes: %v", len(exact), err)
	}
	if _, err := ca.ParseCSR(append([]byte(" "), exact...)); err == nil || !strings.Contains(err.Error(), "64 KiB") {
		t.Fatalf("a CSR of %d bytes: %v, want the size limit", len(exact)+1, err)
	}
	// Caller input quoted in an error is cut after 128 bytes.
	for n, want := range map[int]string{128: strings.Repeat("X", 128) + `"`, 129: strings.Repeat("X", 128) + `..."`} {
		typ := strings.Repeat("X", n)
		_, err := ca.ParseCSR(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: block.Bytes}))
		if err == nil || !strings.Contains(err.Error(), `"`+want) {
			t.Errorf("a PEM block type of %d bytes: %v, want it quoted as %q", n, err, want)
		}
	}
}

// TestRSAKeySizeBounds: an RSA key of MaxRSABits is allowed (its CSR goes
// on to the signature check), one bit more is refused by size first.
func TestRSAKeySizeBounds(t *testing.T) {
	for bits, want := range map[int]string{
		ca.MaxRSABits:     "signature does not verify",
		ca.MaxRSABits + 1: "RSA key of 8193 bits not allowed",
	} {
		_, err := ca.ParseCSR(rsaCSRWithJunkSignature(t, bits, ca.RSAExponent))
		if ca.KindOf(err) != ca.KindInvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("RSA-%d: %v, want invalid_argument %q", bits, err, want)
		}
	}
}

func extension(t *testing.T, id asn1.ObjectIdentifier, critical bool, v any) pkix.Extension {
	t.Helper()
	val, err := asn1.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: id, Critical: critical, Value: val}
}

func TestCSRPolicy(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	id := callerID.String()
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsa2047 := oddRSA(t, 2047)
	basicCA := struct {
		IsCA bool `asn1:"optional"`
	}{true}
	basicNotCA := struct {
		IsCA bool `asn1:"optional"`
	}{false}
	otherName := []asn1.RawValue{{Tag: 0, Class: asn1.ClassContextSpecific, IsCompound: true, Bytes: []byte{0x06, 0x01, 0x2a, 0xa0, 0x03, 0x0c, 0x01, 0x61}}}
	registeredID := []asn1.RawValue{{Tag: 8, Class: asn1.ClassContextSpecific, Bytes: []byte{0x2a}}}

	tests := []struct {
		name string
		csr  csrSpec
		id   spiffeid.ID // the caller's proven identity; zero = callerID
		want ca.Kind     // KindInternal = accepted (never expected as a failure here)
		msg  string
	}{
		// Accepted.
		{name: "URI SAN is the caller", csr: csrSpec{uris: []string{id}}},
		{name: "no SAN: identity from the caller", csr: csrSpec{}},
		{name: "ec-p384 key", csr: csrSpec{key: mustKey(t, certs.ECP384), uris: []string{id}}},
		{name: "ed25519 key", csr: csrSpec{key: mustKey(t, certs.Ed25519), uris: []string{id}}},
		{name: "rsa-2048 key", csr: csrSpec{key: mustKey(t, certs.RSA2048), uris: []string{id}}},
		{name: "subject is ignored", csr: csrSpec{subject: pkix.Name{CommonName: "whatever", Organization: []string{""}}, uris: []string{id}}},
		{name: "basicConstraints CA:false", csr: csrSpec{extra: []pkix.Extension{extension(t, asn1.ObjectIdentifier{2, 5, 29, 19}, true, basicNotCA)}}},

		// Weak or unsupported keys.
		{name: "rsa-1024 key", csr: csrSpec{key: rsa1024}, want: ca.KindInvalidArgument, msg: "RSA key of 1024 bits"},
		{name: "rsa-2047 key", csr: csrSpec{key: rsa2047}, want: ca.KindInvalidArgument, msg: "RSA key of 2047 bits"},
		{name: "rsa over 8192 bits", csr: csrSpec{key: bigRSAKey(t)}, want: ca.KindInvalidArgument, msg: "want 2048 to 8192 bits"},
		{name: "ec-p521 key", csr: csrSpec{key: p521}, want: ca.KindInvalidArgument, msg: "EC curve P-521"},
		{name: "ec-p224 key", csr: csrSpec{key: p224}, want: ca.KindInvalidArgument, msg: "EC curve P-224"},

		// Forbidden extensions and SANs.
		{name: "basicConstraints CA:true", csr: csrSpec{uris: []string{id}, extra: []pkix.Extension{extension(t, asn1.ObjectIdentifier{2, 5, 29, 19}, true, basicCA)}}, want: ca.KindInvalidArgument, msg: "CA:true"},
		{name: "DNS SAN", csr: csrSpec{uris: []string{id}, dns: []string{"evil.example"}}, want: ca.KindInvalidArgument, msg: "DNS SAN"},
		{name: "IP SAN", csr: csrSpec{ips: []net.IP{net.ParseIP("10.0.0.1")}}, want: ca.KindInvalidArgument, msg: "IP SAN"},
		{name: "email SAN", csr: csrSpec{emails: []string{"a@b.example"}}, want: ca.KindInvalidArgument, msg: "email SAN"},
		{name: "otherName SAN", csr: csrSpec{extra: []pkix.Extension{extension(t, oidSAN, false, otherName)}}, want: ca.KindInvalidArgument, msg: "SAN of type [0]"},
		{name: "registeredID SAN", csr: csrSpec{extra: []pkix.Extension{extension(t, oidSAN, false, registeredID)}}, want: ca.KindInvalidArgument, msg: "SAN of type [8]"},
		{name: "two URI SANs, both the caller", csr: csrSpec{uris: []string{id, id}}, want: ca.KindInvalidArgument, msg: "2 URI SANs"},

		// Other identities.
		{name: "another service account", csr: csrSpec{uris: []string{otherID.String()}}, want: ca.KindPermissionDenied, msg: "asks for identity"},
		{name: "another trust domain", csr: csrSpec{uris: []string{"spiffe://evil.example/ns/default/sa/default"}}, want: ca.KindPermissionDenied, msg: "asks for identity"},
		{name: "not a SPIFFE URI", csr: csrSpec{uris: []string{"https://cluster.local/ns/default/sa/default"}}, want: ca.KindPermissionDenied, msg: "asks for identity"},
		{name: "caller's and another URI", csr: csrSpec{uris: []string{id, otherID.String()}}, want: ca.KindPermissionDenied, msg: "asks for identity"},
		{name: "caller outside the trust domain", csr: csrSpec{}, id: spiffeid.RequireFromString("spiffe://evil.example/ns/a/sa/b"), want: ca.KindPermissionDenied, msg: "not in trust domain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pemCSR, _ := mkCSR(t, tc.csr)
			caller := tc.id
			if caller.IsZero() {
				caller = callerID
			}
			iss, err := parseAndSign(a, pemCSR, caller, 0)
			if tc.want == ca.KindInternal {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if len(iss.Leaf.URIs) != 1 || iss.Leaf.URIs[0].String() != caller.String() {
					t.Errorf("leaf URIs %v, want [%s]", iss.Leaf.URIs, caller)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %v", tc.want)
			}
			if iss != nil {
				t.Errorf("Sign returned a certificate with its error")
			}
			if k := ca.KindOf(err); k != tc.want {
				t.Errorf("kind %v, want %v (%v)", k, tc.want, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
		})
	}
}

// oddRSA returns an RSA key whose modulus has exactly bits bits, a size
// rsa.GenerateKey does not produce.
func oddRSA(t *testing.T, bits int) *rsa.PrivateKey {
	t.Helper()
	for {
		// rand.Prime sets the top two bits, so p*q has exactly bits bits.
		p, err := rand.Prime(rand.Reader, bits/2)
		if err != nil {
			t.Fatal(err)
		}
		q, err := rand.Prime(rand.Reader, bits-bits/2)
		if err != nil {
			t.Fatal(err)
		}
		one := big.NewInt(1)
		phi := new(big.Int).Mul(new(big.Int).Sub(p, one), new(big.Int).Sub(q, one))
		d := new(big.Int).ModInverse(big.NewInt(65537), phi)
		if d == nil || p.Cmp(q) == 0 {
			continue
		}
		k := &rsa.PrivateKey{PublicKey: rsa.PublicKey{N: new(big.Int).Mul(p, q), E: 65537}, D: d, Primes: []*big.Int{p, q}}
		k.Precompute()
		if k.N.BitLen() != bits {
			t.Fatalf("modulus has %d bits, want %d", k.N.BitLen(), bits)
		}
		return k
	}
}

// TestIstioAgentCSRs builds CSRs the way istio-agent does, from keys in each
// encoding it loads (PKCS#1, SEC1, PKCS#8), and expects them to be signed.
func TestIstioAgentCSRs(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	type encoding struct {
		name  string
		block string
		der   func(any) ([]byte, error)
	}
	pkcs8 := encoding{"PKCS#8", "PRIVATE KEY", x509.MarshalPKCS8PrivateKey}
	pkcs1 := encoding{"PKCS#1", "RSA PRIVATE KEY", func(k any) ([]byte, error) { return x509.MarshalPKCS1PrivateKey(k.(*rsa.PrivateKey)), nil }}
	sec1 := encoding{"SEC1", "EC PRIVATE KEY", func(k any) ([]byte, error) { return x509.MarshalECPrivateKey(k.(*ecdsa.PrivateKey)) }}
	tests := []struct {
		kt  certs.KeyType
		enc encoding
	}{
		{certs.RSA2048, pkcs1}, {certs.RSA2048, pkcs8},
		{certs.ECP256, sec1}, {certs.ECP256, pkcs8},
		{certs.ECP384, sec1}, {certs.ECP384, pkcs8},
	}
	for _, tc := range tests {
		for _, critical := range []bool{false, true} {
			name := string(tc.kt) + "/" + tc.enc.name
			if critical {
				name += "/critical SAN"
			}
			t.Run(name, func(t *testing.T) {
				der, err := tc.enc.der(mustKey(t, tc.kt))
				if err != nil {
					t.Fatal(err)
				}
				key, err := certs.ParsePrivateKey(pem.EncodeToMemory(&pem.Block{Type: tc.enc.block, Bytes: der}))
				if err != nil {
					t.Fatal(err)
				}
				iss, err := parseAndSign(a, istioCSR(t, key, callerID.String(), critical), callerID, 0)
				if err != nil {
					t.Fatalf("istio-agent CSR rejected: %v", err)
				}
				if !certs.KeyMatches(iss.Leaf.PublicKey, key) || iss.Leaf.URIs[0].String() != callerID.String() {
					t.Errorf("leaf does not carry the agent's key and identity")
				}
				verifyChain(t, iss, t0)
			})
		}
	}
}

// TestVerifyCSR: a CSR parsed elsewhere becomes a verified CSR only through
// VerifyCSR, which checks its signature; Sign refuses a CSR that did not go
// through ParseCSR or VerifyCSR.
func TestVerifyCSR(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	good, _ := mkCSR(t, csrSpec{uris: []string{callerID.String()}})
	block, _ := pem.Decode(good)
	der := bytes.Clone(block.Bytes)
	der[len(der)-2] ^= 0xff
	tampered, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.VerifyCSR(tampered); ca.KindOf(err) != ca.KindInvalidArgument || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("VerifyCSR(tampered) = %v, want invalid_argument about the signature", err)
	}
	parsed, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ca.VerifyCSR(parsed)
	if err != nil {
		t.Fatalf("VerifyCSR(good): %v", err)
	}
	if _, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID}); err != nil {
		t.Fatalf("Sign(verified CSR): %v", err)
	}
	if _, err := a.Sign(context.Background(), ca.Request{CSR: &ca.CSR{}, ID: callerID}); ca.KindOf(err) != ca.KindInvalidArgument {
		t.Fatalf("Sign(zero CSR) = %v, want invalid_argument", err)
	}
	if _, err := a.Sign(context.Background(), ca.Request{ID: callerID}); ca.KindOf(err) != ca.KindInvalidArgument {
		t.Fatalf("Sign(no CSR) = %v, want invalid_argument", err)
	}
	if _, err := a.Sign(context.Background(), ca.Request{CSR: csr}); ca.KindOf(err) != ca.KindInternal {
		t.Fatalf("Sign(no identity) = %v, want internal", err)
	}
}
