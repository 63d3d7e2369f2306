package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// pki is the key material a cluster is started with. It is generated with
// crypto/x509 directly: these are test fixtures for the API server, not
// meshid certificates, and the harness must not depend on the code under test.
type pki struct {
	caCert     *x509.Certificate // signs the serving cert and the client certs
	caKey      crypto.Signer
	servingPEM []byte // serving cert, then the CA
	servingKey []byte
	adminCert  []byte // client cert CN=meshid-admin O=system:masters
	adminKey   []byte
	saKey      crypto.Signer // service-account token signing key
}

// Service-account key types (Config.ServiceAccountKeyType).
const (
	// KeyECP256 is an ECDSA P-256 key: ES256 tokens.
	KeyECP256 = "ec-p256"
	// KeyRSA2048 is an RSA-2048 key: RS256 tokens, as kubeadm, EKS, GKE
	// and AKS sign them.
	KeyRSA2048 = "rsa-2048"
)

func newSAKey(keyType string) (crypto.Signer, error) {
	switch keyType {
	case KeyECP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyRSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	}
	return nil, fmt.Errorf("harness: service-account key type %q is not %s or %s", keyType, KeyECP256, KeyRSA2048)
}

func newPKI(now time.Time, saKeyType string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("harness: ca key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "meshid-test-kube-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caCert, err := sign(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	p := &pki{caCert: caCert, caKey: caKey}

	p.servingPEM, p.servingKey, err = p.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, now)
	if err != nil {
		return nil, err
	}
	p.adminCert, p.adminKey, err = p.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "meshid-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, now)
	if err != nil {
		return nil, err
	}
	p.saKey, err = newSAKey(saKeyType)
	if err != nil {
		return nil, fmt.Errorf("harness: service-account key: %w", err)
	}
	return p, nil
}

// leaf issues a certificate from the cluster CA and returns the PEM chain
// (leaf, CA) and the PEM key.
func (p *pki) leaf(tmpl *x509.Certificate, now time.Time) (chainPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("harness: leaf key: %w", err)
	}
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	cert, err := sign(tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return append(encodeCert(cert), encodeCert(p.caCert)...), keyPEM, nil
}

// ClientCert issues a client certificate for user cn in groups orgs, signed
// by the CA the API server trusts (--client-ca-file).
func (p *pki) clientCert(cn string, orgs []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	return p.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, now)
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("harness: serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, fmt.Errorf("harness: create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("harness: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

func encodePublicKey(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("harness: marshal public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}
