package testkit

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/meshid/meshid/certs"
)

// StepCA is a real step-ca (built by scripts/build-step-ca.sh at the
// version scripts/step-ca/go.mod pins) on loopback TLS, with a root, an
// intermediate that signs, and two JWK provisioners: StepProvisionerCA,
// whose x509 template issues CA certificates of path length 0 (the meshid
// intermediate), and StepProvisionerLeaf, step's default leaf template (an
// answer meshid must refuse).
type StepCA struct {
	Addr         string            // 127.0.0.1:PORT
	Root         *x509.Certificate // step-ca's root
	RootFile     string            // PEM of Root: ca= (it verifies step-ca's TLS too)
	KeyFile      string            // StepProvisionerCA's private JWK, mode 0600
	LeafKeyFile  string            // StepProvisionerLeaf's private JWK, mode 0600
	Intermediate *x509.Certificate // what signs in step-ca
	bin, dir     string
	mu           sync.Mutex
	cmd          *exec.Cmd
}

// Provisioners of a StepCA.
const (
	StepProvisionerCA   = "meshid"
	StepProvisionerLeaf = "leaf"
)

// StepCABinary builds (once per machine, cached) and returns step-ca.
func StepCABinary(t testing.TB) string {
	t.Helper()
	return buildBinary(t, "build-step-ca.sh")
}

// StepCATemplate is the x509 template of StepProvisionerCA for trust
// domain td: what docs/upstream.md tells an operator to configure (a CA of
// path length 0 that may sign the trust domain's SPIFFE IDs and the meshid
// CA's own serving names, nothing else).
func StepCATemplate(td string) string {
	return `{
	"subject": {{ toJson .Subject }},
	"sans": {{ toJson .SANs }},
	"keyUsage": ["certSign", "crlSign"],
	"basicConstraints": {"isCA": true, "maxPathLen": 0},
	"nameConstraints": {"critical": true, "permittedURIDomains": [` + jsonString(td) + `],
		"permittedDNSDomains": ["istiod.istio-system.svc", "localhost"]}
}`
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// StartStepCA starts step-ca whose provisioners may issue for up to
// maxDuration (their maxTLSCertDuration and default), for trust domain td,
// until the test ends.
func StartStepCA(t testing.TB, maxDuration time.Duration, td string) *StepCA {
	t.Helper()
	dir := t.TempDir()
	s := &StepCA{bin: StepCABinary(t), dir: dir}
	now := time.Now()
	root, rootKey := Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "corp root CA (step-ca)"}, NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 2})
	interKey := Key(t, certs.ECP256)
	s.Intermediate = Certificate(t, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "corp intermediate CA (step-ca)"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(47 * time.Hour),
		BasicConstraintsValid: true, IsCA: true, MaxPathLen: 1,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}, root, interKey.Public(), rootKey)
	s.Root = root
	ik, err := certs.EncodePrivateKey(interKey)
	if err != nil {
		t.Fatal(err)
	}
	caPub, caPriv := stepJWK(t)
	leafPub, leafPriv := stepJWK(t)
	claims := map[string]any{
		"minTLSCertDuration": "1m", "maxTLSCertDuration": maxDuration.String(), "defaultTLSCertDuration": maxDuration.String(),
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = l.Addr().String()
	l.Close()
	f := func(n string) string { return filepath.Join(dir, n) }
	conf, _ := json.Marshal(map[string]any{
		"root": f("root_ca.crt"), "crt": f("intermediate_ca.crt"), "key": f("intermediate_ca_key"),
		"address": s.Addr, "dnsNames": []string{"127.0.0.1"},
		"logger": map[string]any{"format": "text"},
		"authority": map[string]any{"provisioners": []any{
			map[string]any{"type": "JWK", "name": StepProvisionerCA, "key": caPub, "claims": claims,
				"options": map[string]any{"x509": map[string]any{"template": StepCATemplate(td)}}},
			map[string]any{"type": "JWK", "name": StepProvisionerLeaf, "key": leafPub, "claims": claims},
		}},
	})
	files := map[string][]byte{
		"root_ca.crt": certs.EncodeCertificates(root), "intermediate_ca.crt": certs.EncodeCertificates(s.Intermediate),
		"intermediate_ca_key": ik, "ca.json": conf, "meshid.jwk": caPriv, "leaf.jwk": leafPriv,
	}
	for name, data := range files {
		if err := os.WriteFile(f(name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.RootFile, s.KeyFile, s.LeafKeyFile = f("root_ca.crt"), f("meshid.jwk"), f("leaf.jwk")
	s.Start(t)
	t.Cleanup(s.Stop)
	return s
}

// stepJWK returns a new provisioner key as step writes it: the public JWK
// (for ca.json) and the private one (the credentials), kid its SHA-256
// thumbprint.
func stepJWK(t testing.TB) (pub, priv json.RawMessage) {
	t.Helper()
	jwk := jose.JSONWebKey{Key: Key(t, certs.ECP256), Algorithm: string(jose.ES256), Use: "sig"}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	jwk.KeyID = base64.RawURLEncoding.EncodeToString(tp)
	if priv, err = json.Marshal(jwk); err != nil {
		t.Fatal(err)
	}
	if pub, err = json.Marshal(jwk.Public()); err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// Start (re)starts step-ca on Addr and waits until it accepts connections.
func (s *StepCA) Start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(s.bin, filepath.Join(s.dir, "ca.json"))
	cmd.Env = append(os.Environ(), "STEPPATH="+filepath.Join(s.dir, "steppath"), "HOME="+s.dir)
	startProcess(t, cmd, "Serving HTTPS on", s.Addr, "step-ca")
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
}

// Stop stops step-ca (the upstream goes down).
func (s *StepCA) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	stopProcess(s.cmd)
	s.cmd = nil
}
