package inspect

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/meshid/meshid/certs"
)

// The detail types below are the documented, stable JSON shape of
// `meshid inspect -o json` (see docs/guide/inspect.md, "-o json"). Add fields;
// never rename or remove one.
//
// cfssl's certinfo was considered and not used: its Certificate omits URI
// SANs (the SPIFFE ID), key usage, extended key usage, basic constraints and
// fingerprints, and importing it links cfssl's certdb (sqlx) and
// certificate-transparency packages into the binary. go-spiffe's x509svid
// is used for the SPIFFE ID.

// Certificate describes one X.509 certificate.
type Certificate struct {
	Subject            string            `json:"subject"`
	Issuer             string            `json:"issuer"`
	Serial             string            `json:"serial"`
	SPIFFEID           string            `json:"spiffe_id"`
	SANs               SANs              `json:"sans"`
	NotBefore          time.Time         `json:"not_before"`
	NotAfter           time.Time         `json:"not_after"`
	ExpiresIn          string            `json:"expires_in"`
	ExpiresInSeconds   int64             `json:"expires_in_seconds"`
	PublicKey          PublicKey         `json:"public_key"`
	SignatureAlgorithm string            `json:"signature_algorithm"`
	KeyUsage           []string          `json:"key_usage"`
	ExtKeyUsage        []string          `json:"extended_key_usage"`
	BasicConstraints   *BasicConstraints `json:"basic_constraints"`
	SHA256Fingerprint  string            `json:"sha256_fingerprint"`
	SubjectKeyID       string            `json:"subject_key_id"`
	AuthorityKeyID     string            `json:"authority_key_id"`
	SelfSigned         bool              `json:"self_signed"`
}

// SANs are the subject alternative names, by kind.
type SANs struct {
	URI   []string `json:"uri"`
	DNS   []string `json:"dns"`
	IP    []string `json:"ip"`
	Email []string `json:"email"`
}

// PublicKey describes a public key.
type PublicKey struct {
	Type      string `json:"type"`      // meshid key type name: ec-p256, rsa-2048, ed25519
	Algorithm string `json:"algorithm"` // ECDSA, RSA, Ed25519
	Bits      int    `json:"bits"`
}

// BasicConstraints is the basicConstraints extension.
type BasicConstraints struct {
	CA bool `json:"ca"`
	// MaxPathLen is the path length constraint; nil means none (unlimited).
	MaxPathLen *int `json:"max_path_len"`
}

// PrivateKey describes a private key without revealing it.
type PrivateKey struct {
	Source    string    `json:"source"` // where the key came from
	PublicKey PublicKey `json:"public_key"`
	// Matches says whether the key belongs to the certificate (or CSR) it
	// came with; nil when there is nothing to compare with.
	Matches *bool `json:"matches"`
}

// CSR describes a certificate signing request.
type CSR struct {
	Subject            string    `json:"subject"`
	SPIFFEID           string    `json:"spiffe_id"`
	SANs               SANs      `json:"sans"`
	PublicKey          PublicKey `json:"public_key"`
	SignatureAlgorithm string    `json:"signature_algorithm"`
	SignatureValid     bool      `json:"signature_valid"`
}

// DescribeCertificate returns the details of c as seen at now.
func DescribeCertificate(c *x509.Certificate, now time.Time) Certificate {
	d := Certificate{
		Subject:            c.Subject.String(),
		Issuer:             c.Issuer.String(),
		Serial:             Serial(c),
		SPIFFEID:           spiffeID(c),
		SANs:               sansOf(c.URIs, c.DNSNames, c.IPAddresses, c.EmailAddresses),
		NotBefore:          c.NotBefore.UTC(),
		NotAfter:           c.NotAfter.UTC(),
		ExpiresIn:          ExpiresIn(c.NotAfter.Sub(now)),
		ExpiresInSeconds:   int64(c.NotAfter.Sub(now) / time.Second),
		PublicKey:          describeKey(c.PublicKey),
		SignatureAlgorithm: c.SignatureAlgorithm.String(),
		KeyUsage:           keyUsages(c.KeyUsage),
		ExtKeyUsage:        extKeyUsages(c.ExtKeyUsage, c.UnknownExtKeyUsage),
		SHA256Fingerprint:  Fingerprint(c),
		SubjectKeyID:       hexColon(c.SubjectKeyId),
		AuthorityKeyID:     hexColon(c.AuthorityKeyId),
		SelfSigned:         selfSigned(c),
	}
	if c.BasicConstraintsValid {
		bc := &BasicConstraints{CA: c.IsCA}
		if c.IsCA && (c.MaxPathLen > 0 || c.MaxPathLenZero) {
			n := c.MaxPathLen
			bc.MaxPathLen = &n
		}
		d.BasicConstraints = bc
	}
	return d
}

// DescribeCSR returns the details of a CSR.
func DescribeCSR(r *x509.CertificateRequest) CSR {
	d := CSR{
		Subject:            r.Subject.String(),
		SANs:               sansOf(r.URIs, r.DNSNames, r.IPAddresses, r.EmailAddresses),
		PublicKey:          describeKey(r.PublicKey),
		SignatureAlgorithm: r.SignatureAlgorithm.String(),
		SignatureValid:     r.CheckSignature() == nil,
	}
	if len(r.URIs) == 1 && r.URIs[0].Scheme == "spiffe" {
		d.SPIFFEID = r.URIs[0].String()
	}
	return d
}

func describeKey(pub crypto.PublicKey) PublicKey {
	p := PublicKey{Type: certs.KeyTypeOf(pub)}
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		p.Algorithm, p.Bits = "ECDSA", k.Curve.Params().BitSize
	case *rsa.PublicKey:
		p.Algorithm, p.Bits = "RSA", k.N.BitLen()
	case ed25519.PublicKey:
		p.Algorithm, p.Bits = "Ed25519", 256
	default:
		p.Algorithm = fmt.Sprintf("%T", pub)
	}
	return p
}

// Serial formats a serial number as lowercase hex, as istioctl does.
func Serial(c *x509.Certificate) string {
	if c.SerialNumber == nil {
		return ""
	}
	return c.SerialNumber.Text(16)
}

// Fingerprint is the SHA-256 fingerprint of c's DER, as colon-separated hex.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hexColon(sum[:])
}

func hexColon(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var sb strings.Builder
	for i, x := range b {
		if i > 0 {
			sb.WriteByte(':')
		}
		fmt.Fprintf(&sb, "%02X", x)
	}
	return sb.String()
}

// spiffeID is c's SPIFFE ID, or "" when it has none (go-spiffe decides).
func spiffeID(c *x509.Certificate) string {
	id, err := x509svid.IDFromCert(c)
	if err != nil {
		return ""
	}
	return id.String()
}

func sansOf(uris []*url.URL, dns []string, ips []net.IP, emails []string) SANs {
	s := SANs{URI: []string{}, DNS: []string{}, IP: []string{}, Email: []string{}}
	for _, u := range uris {
		s.URI = append(s.URI, u.String())
	}
	s.DNS = append(s.DNS, dns...)
	for _, ip := range ips {
		s.IP = append(s.IP, ip.String())
	}
	s.Email = append(s.Email, emails...)
	return s
}

var keyUsageNames = []struct {
	bit  x509.KeyUsage
	name string
}{
	{x509.KeyUsageDigitalSignature, "Digital Signature"},
	{x509.KeyUsageContentCommitment, "Content Commitment"},
	{x509.KeyUsageKeyEncipherment, "Key Encipherment"},
	{x509.KeyUsageDataEncipherment, "Data Encipherment"},
	{x509.KeyUsageKeyAgreement, "Key Agreement"},
	{x509.KeyUsageCertSign, "Cert Sign"},
	{x509.KeyUsageCRLSign, "CRL Sign"},
	{x509.KeyUsageEncipherOnly, "Encipher Only"},
	{x509.KeyUsageDecipherOnly, "Decipher Only"},
}

func keyUsages(ku x509.KeyUsage) []string {
	out := []string{}
	for _, k := range keyUsageNames {
		if ku&k.bit != 0 {
			out = append(out, k.name)
		}
	}
	return out
}

var extKeyUsageNames = map[x509.ExtKeyUsage]string{
	x509.ExtKeyUsageAny:                            "Any",
	x509.ExtKeyUsageServerAuth:                     "Server Auth",
	x509.ExtKeyUsageClientAuth:                     "Client Auth",
	x509.ExtKeyUsageCodeSigning:                    "Code Signing",
	x509.ExtKeyUsageEmailProtection:                "Email Protection",
	x509.ExtKeyUsageIPSECEndSystem:                 "IPSec End System",
	x509.ExtKeyUsageIPSECTunnel:                    "IPSec Tunnel",
	x509.ExtKeyUsageIPSECUser:                      "IPSec User",
	x509.ExtKeyUsageTimeStamping:                   "Time Stamping",
	x509.ExtKeyUsageOCSPSigning:                    "OCSP Signing",
	x509.ExtKeyUsageMicrosoftServerGatedCrypto:     "Microsoft Server Gated Crypto",
	x509.ExtKeyUsageNetscapeServerGatedCrypto:      "Netscape Server Gated Crypto",
	x509.ExtKeyUsageMicrosoftCommercialCodeSigning: "Microsoft Commercial Code Signing",
	x509.ExtKeyUsageMicrosoftKernelCodeSigning:     "Microsoft Kernel Code Signing",
}

func extKeyUsages(eku []x509.ExtKeyUsage, unknown []asn1.ObjectIdentifier) []string {
	out := []string{}
	for _, e := range eku {
		if n, ok := extKeyUsageNames[e]; ok {
			out = append(out, n)
		} else {
			out = append(out, fmt.Sprintf("ExtKeyUsage(%d)", e))
		}
	}
	for _, oid := range unknown {
		out = append(out, oid.String())
	}
	return out
}

// ExpiresIn renders a remaining lifetime the way operators read it:
// "11h58m" under two days, "89d23h" above, "42m" under an hour, "45s"
// under a minute and
// "expired" at or below zero.
func ExpiresIn(d time.Duration) string {
	switch {
	case d <= 0:
		return "expired"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// Ago renders how long ago something happened, e.g. "2h3m", "3d4h".
func Ago(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return ExpiresIn(d)
}
