package ca

import (
	"crypto/x509"
	"runtime"
	"sync"
	"weak"
)

// verifiedCSRs remembers the CSRs whose signature ParseCSR has checked, so
// that Sign, which must never sign without proof of possession, checks the
// signature only of CSRs that did not come from ParseCSR. The check is the
// largest single cost of an issuance (an ECDSA P-256 verify costs about
// twice the CA's sign), so doing it twice would add some 45% CPU per
// certificate; this bookkeeping costs about 2%.
//
// Keys are weak pointers: an entry never keeps a CSR alive, and a cleanup
// removes it once the CSR is garbage.
var verifiedCSRs sync.Map // weak.Pointer[x509.CertificateRequest] -> struct{}

func markVerified(csr *x509.CertificateRequest) {
	wp := weak.Make(csr)
	verifiedCSRs.Store(wp, struct{}{})
	runtime.AddCleanup(csr, func(wp weak.Pointer[x509.CertificateRequest]) { verifiedCSRs.Delete(wp) }, wp)
}

// isVerified reports whether ParseCSR checked csr's signature. A caller
// that modifies a parsed CSR's public key is outside this guarantee.
func isVerified(csr *x509.CertificateRequest) bool {
	_, ok := verifiedCSRs.Load(weak.Make(csr))
	return ok
}
