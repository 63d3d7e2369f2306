// Package ca is the signing core of the meshid certificate authority: the
// CSR policy, the leaf certificate template and the Authority that signs a
// caller's proven SPIFFE identity. Errors carry a Kind that the gRPC layer
// maps to a status code in one place.
//
// A request goes through ParseCSR (size, PEM, key type and size, then the
// signature: the proof of possession), which returns a verified *CSR, and
// then Authority.Sign (policy, TTL, leaf). The identity in
// the leaf is always the caller's proven one; the CSR contributes only its
// public key. Sign is lock-free and safe for concurrent use; SetBundle swaps
// the CA material atomically. How leaves are signed, and why not with
// cfssl's signer or x509.CreateCertificate, is explained in sign.go.
package ca
