package ca

import (
	"crypto/x509"
)

// CSR is a certificate request whose proof of possession has been checked:
// its key is of an allowed type and size and its signature verifies. Only
// ParseCSR and VerifyCSR make one, so Authority.Sign, which must never sign
// without that proof, need not check the signature again (the check is the
// largest single cost of an issuance: an ECDSA P-256 verify costs about
// twice the CA's sign). The zero CSR is refused by Sign.
type CSR struct {
	req *x509.CertificateRequest
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

// Request returns a shallow copy of the parsed request, for reading its
// fields (URIs, Subject...).
func (c *CSR) Request() *x509.CertificateRequest {
	r := *c.req
	return &r
}
