// Package ca is the signing core of the meshid certificate authority: the
// CSR policy, the leaf certificate template and the Authority that signs a
// caller's proven SPIFFE identity. Errors carry a Kind that the gRPC layer
// maps to a status code in one place.
package ca
