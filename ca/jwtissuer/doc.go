// Package jwtissuer mints the CA's JWT-SVIDs: short-lived, audience-bound
// tokens whose subject is the SPIFFE ID a caller proved (ca/certservice
// authenticates it exactly as for CreateCertificate), signed with ES256 by
// a dedicated signing key, and the JWKS bundle that verifies them.
//
// The JWT signing keys are not the X.509 CA key. The CA key may be RSA or
// P-384, may live in a PKCS#11 module that cannot be made to sign JWS
// payloads, and rotates on a scale of months or years; a JWT key is an
// ES256 key that rotates every day and is published as a raw public key in
// a JWKS. Keeping them apart also means one key never signs two formats
// (X.509 TBS structures and JSON payloads), so no cross-protocol confusion
// is possible, and a leaked JWT key cannot mint certificates.
//
// The keys come from a KeySource (package ca/jwtkeys): each is published
// one lifetime before it signs, signs for one lifetime, then stays
// published for TTL more, the life of the last token it signed, so the
// JWKS holds at most three keys. A single CA keeps them in memory and under
// its --state-dir (jwtkeys.Local), so a restart keeps the tokens already
// issued valid; the replicas of a CA in Kubernetes share them through a
// Secret that the elected leader writes (ca/kube/jwtsecret), so a token
// minted by one replica validates against the bundle of any other.
package jwtissuer
