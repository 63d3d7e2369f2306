// Package caclient is the agent's client of the CA's CreateCertificate API
// (istio.v1.auth.IstioCertificateService), the same API istio-agent calls, so
// it works against meshid's CA and against istiod.
//
// Every request is sent over TLS verified with the configured roots, with an
// "authorization: Bearer <token>" header read from the token file for that
// request (projected service-account tokens rotate), and with ClusterID in
// the request metadata when configured.
//
// The CSR is a parsed *x509.CertificateRequest; it is PEM-encoded only on
// the wire. The answer is checked before it is returned, by Verify, the
// agent's one check of a CA's answer: the leaf must certify the CSR's public
// key and be an X509-SVID for exactly the CSR's SPIFFE ID, and the chain must
// verify to the root bundle of the answer at the current time. Every refusal
// wraps ErrInvalidResponse; FailureCode names failures for logs and metrics. The returned roots
// are not additionally required to be among the configured roots: the answer
// arrives over a channel authenticated with those roots, so its bundle is as
// trustworthy as the channel, and requiring an overlap would break a root
// rotation in which the CA distributes the new root before the agent's
// --ca-root file is updated. gRPC status codes from the CA are preserved in
// the returned errors (status.Code works on them).
package caclient
