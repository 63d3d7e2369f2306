package catool

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"

	cflog "github.com/cloudflare/cfssl/log"

	"github.com/cloudflare/cfssl/config"
	"github.com/cloudflare/cfssl/csr"
	cfsigner "github.com/cloudflare/cfssl/signer"
	"github.com/cloudflare/cfssl/signer/local"

	"github.com/meshid/meshid/certs"
)

func init() {
	// cfssl logs every CSR and signature at Info on the standard logger;
	// the commands report what they wrote themselves.
	cflog.Level = cflog.LevelError
}

// caUsages are the key usages of every CA certificate meshid makes.
var caUsages = []string{"cert sign", "crl sign", "digital signature"}

// caSpec is one CA certificate to issue.
type caSpec struct {
	subject   pkix.Name
	key       crypto.Signer // the new CA's key (may live in a PKCS#11 module)
	notBefore time.Time
	notAfter  time.Time
	// maxPathLen is the basicConstraints path length; -1 means unlimited.
	maxPathLen int
}

// issueCA signs spec with cfssl: a CSR for spec.key (csr.Generate), signed
// by cfssl's local signer under a CA profile, as cfssl's initca does. With a
// nil parent the certificate is self-signed (a root).
func issueCA(spec caSpec, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, error) {
	req := &csr.CertificateRequest{CN: spec.subject.CommonName, Names: []csr.Name{{
		O: first(spec.subject.Organization),
		L: first(spec.subject.Locality),
	}}}
	csrPEM, err := csr.Generate(spec.key, req)
	if err != nil {
		return nil, fmt.Errorf("CSR: %v", err)
	}
	profile := &config.SigningProfile{
		Usage:        caUsages,
		Expiry:       spec.notAfter.Sub(spec.notBefore),
		CAConstraint: config.CAConstraint{IsCA: true, MaxPathLen: spec.maxPathLen, MaxPathLenZero: spec.maxPathLen == 0},
	}
	if parent == nil {
		parentKey = spec.key
	}
	s, err := local.NewSigner(parentKey, parent, cfsigner.DefaultSigAlgo(parentKey), &config.Signing{Default: profile})
	if err != nil {
		return nil, fmt.Errorf("signer: %v", err)
	}
	certPEM, err := s.Sign(cfsigner.SignRequest{Request: string(csrPEM), NotBefore: spec.notBefore, NotAfter: spec.notAfter})
	if err != nil {
		return nil, fmt.Errorf("sign: %v", err)
	}
	cs, err := certs.ParseCertificates(certPEM)
	if err != nil {
		return nil, err
	}
	return cs[0], nil
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// subject is the subject of a CA made by meshid certs.
func subject(org, cn, locality string) pkix.Name {
	n := pkix.Name{CommonName: cn}
	if org != "" {
		n.Organization = []string{org}
	}
	if locality != "" {
		n.Locality = []string{locality}
	}
	return n
}
