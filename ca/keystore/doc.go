// Package keystore loads and validates the CA's key material: a plugged-in
// CA directory in Istio's cacerts layout (ca-cert.pem, ca-key.pem,
// cert-chain.pem, root-cert.pem) or the Kubernetes TLS layout (tls.crt,
// tls.key, ca.crt), or a self-signed root that it creates on first start and
// keeps in a state directory.
//
// Every Bundle it returns has been validated: the key matches the signing
// certificate, the certificate is a CA allowed to sign certificates, the
// chain verifies to the roots, and nothing is expired or not yet valid. A
// failure names the file at fault.
package keystore
