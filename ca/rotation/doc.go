// Package rotation rotates the CA without downtime: it decides which CA
// signs and which roots are trusted while one CA replaces another, and
// hands the result to the authority (a Target) as one keystore.Bundle.
//
// A rotation passes three steps, after SPIRE's prepared/active/old slots:
//
//   - prepared: the new CA is loaded and checked, its roots join the trust
//     bundle, and the old CA still signs. The bundle is now the union of
//     the old and the new roots, and reaches every consumer (the root
//     element of each CreateCertificate answer, the istio-ca-root-cert
//     ConfigMaps, <state-dir>/root-cert.pem, the agents' ROOTCA) before any
//     leaf is signed by the new CA.
//   - active: after Config.Propagation (or an explicit Activate) the new CA
//     signs. The old roots stay trusted: leaves the old CA signed are still
//     alive.
//   - retired: Config.RetireAfter after the activation (the longest leaf
//     the old CA can have issued, plus clock skew) the old roots leave the
//     bundle, and the rotation is back to stable, one CA and its roots.
//
// A new CA whose roots are already trusted (an intermediate rotated under
// the same root) needs no propagation: it signs at once. A new CA that does
// not validate (key mismatch, expired, not a CA, broken chain) is refused
// with its error, which names the file at fault; the CA in use keeps
// signing and meshid_ca_rotation_stuck says so until a valid CA arrives.
package rotation
