// Package jwtkeys holds the JWT-SVID signing keys of the CA (ca/jwtissuer)
// as a Set: ES256 keys, each with the interval in which it signs, rotated
// on a schedule that every replica computes the same way from the Set
// alone, and an encoding of the Set (with the private keys) for storage.
//
// Each key is published for one lifetime before it signs (so a validator
// that refreshes its bundle more often than that already trusts it), signs
// for one lifetime, then stays published for the token TTL more, the life
// of the last token it signed. Because the next key is in the Set a
// lifetime before it signs, a replica that only reads the Set (a CA
// replica that is not the leader) switches to it on time without writing.
//
// Two stores keep a Set:
//
//   - Local, one CA process: in memory, and with a directory (the CA's
//     --state-dir) in a 0600 file written atomically, so a restarted CA
//     signs with the keys its validators already trust;
//   - ca/kube/jwtsecret, a replicated CA in Kubernetes: a Secret that the
//     elected leader writes and every replica watches, so every replica
//     signs with and publishes the same keys.
//
// Parse is the trust boundary of both: it accepts only P-256 private keys
// whose key ID is their RFC 7638 thumbprint, at most MaxKeys of them, in at
// most MaxEncodedSize bytes.
package jwtkeys
