package ca

import (
	"crypto/x509"
	"net/url"
)

// CSR is a certificate request whose proof of possession has been checked:
// its key is of an allowed type and size and its signature verifies. Only
// ParseCSR and VerifyCSR make one, so Authority.Sign, which must never sign
// without that proof, need not check the signature again (the check is the
// largest single cost of an issuance: an ECDSA P-256 verify costs about
// twice the CA's sign). The zero CSR is refused by Sign.
type CSR struct {
	req *x509.CertificateRequest
	// partial: req is parseCSRFast's, without Subject and Attributes.
	partial bool
}

// VerifyCSR checks an already parsed request as ParseCSR does (key type and
// size first, then the signature) and returns it as a verified CSR. The
// caller must not modify csr afterwards.
func VerifyCSR(csr *x509.CertificateRequest) (*CSR, error) {
	if csr == nil {
		return nil, reject(reasonBadCSR, KindInvalidArgument, "request has no CSR")
	}
	// The key is checked before the signature: verifying a signature made
	// with a huge RSA modulus or exponent costs seconds of CPU, refusing
	// the key microseconds.
	if err := checkLeafKey(csr.PublicKey); err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, &rejection{reason: reasonBadCSR, err: &Error{Kind: KindInvalidArgument, Msg: "CSR signature does not verify", Err: err}}
	}
	return &CSR{req: csr}, nil
}

// Request returns the parsed request, every field as
// x509.ParseCertificateRequest returns it, for reading (Subject...): a
// shallow copy, or a fresh parse when ParseCSR's own parser read only what
// the CA needs (csrparse.go). For the SPIFFE ID, URIs is cheaper.
func (c *CSR) Request() *x509.CertificateRequest {
	if c.partial {
		if r, err := x509.ParseCertificateRequest(c.req.Raw); err == nil {
			return r
		}
	}
	r := *c.req
	return &r
}

// URIs returns the request's URI SANs. The slice is shared: do not modify it.
func (c *CSR) URIs() []*url.URL { return c.req.URIs }
