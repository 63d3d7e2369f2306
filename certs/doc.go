// Package certs holds the X.509 helpers shared by the CA, the agent and the
// CLI: key types by name (KeyTypes, and CAKeyTypes for CA keys), key
// generation, PEM encoding and parsing at the edges (ParseCertificates,
// ParsePrivateKey: one parser for each kind of thing), CSR construction, CA
// certificate templates, chain verification (VerifyChain, and VerifySVID for
// X509-SVIDs), renewal policy and atomic file writes. Values stay typed
// inside meshid; PEM is encoded and decoded here. (The CA's strict CSR
// parser, ca.ParseCSR, and inspect's multi-block reader use its block types.)
package certs
