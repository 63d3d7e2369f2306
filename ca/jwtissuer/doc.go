// Package jwtissuer mints the CA's JWT-SVIDs: short-lived, audience-bound
// tokens whose subject is the SPIFFE ID a caller proved (ca/server
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
// Keys live in memory only and rotate on the injected clock: each key is
// published for one KeyLifetime before it signs (so every validator that
// refreshes its bundle more often than that already trusts it), signs for
// one KeyLifetime, then stays published for TTL more, the life of the last
// token it signed. The JWKS therefore holds at most three keys. A restarted
// CA starts with new keys: tokens of the old process stop verifying once
// validators refresh their bundle, after at most TTL (5 minutes by
// default) they would have expired anyway.
package jwtissuer
