package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// nodePKI is the key material between the API server and the kubelet: a CA
// of the node's own, the kubelet's serving certificate (localhost,
// 127.0.0.1: the API server dials the node by its name, "localhost") and the
// client certificate the API server presents to the kubelet for logs and
// exec. Test fixtures, made with crypto/x509 directly.
type nodePKI struct {
	caPEM                   []byte
	servingPEM, servingKey  []byte
	apiClientPEM, apiClient []byte
}

// apiserverKubeletUser is the user of the API server's kubelet client
// certificate, bound to system:kubelet-api-admin as kubeadm binds it.
const apiserverKubeletUser = "kube-apiserver-kubelet-client"

func newNodePKI(now time.Time) (*nodePKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("node: ca key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "meshid-test-node-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caCert, err := signCert(caTmpl, caTmpl, caKey, caKey)
	if err != nil {
		return nil, err
	}
	p := &nodePKI{caPEM: pemCert(caCert)}
	leaf := func(tmpl *x509.Certificate) ([]byte, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, fmt.Errorf("node: key: %w", err)
		}
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		cert, err := signCert(tmpl, caCert, key, caKey)
		if err != nil {
			return nil, nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, nil, fmt.Errorf("node: key: %w", err)
		}
		return pemCert(cert), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	}
	if p.servingPEM, p.servingKey, err = leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return nil, err
	}
	if p.apiClientPEM, p.apiClient, err = leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: apiserverKubeletUser},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, err
	}
	return p, nil
}

func signCert(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer *ecdsa.PrivateKey) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("node: serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("node: certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// writeFiles writes name -> content under the node's directory, 0600.
func writeFiles(files map[string][]byte) error {
	for p, data := range files {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	return nil
}
