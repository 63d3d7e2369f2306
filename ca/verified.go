package ca

import (
	"crypto/x509"
	"runtime"
	"sync"
	"weak"
)

// verifiedCSRs remembers the CSRs whose signature ParseCSR has checked, so
// that Sign, which must never sign without proof of possession, checks the
// signature only of CSRs that did not come from ParseCSR. A signature check
// costs as much as signing itself (an ECDSA P-256 verify is about twice a
// sign), so checking twice would cut throughput by a third.
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
