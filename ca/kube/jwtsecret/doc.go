// Package jwtsecret shares the CA's JWT-SVID signing keys (a jwtkeys.Set)
// between the replicas of a CA in Kubernetes, so that a JWT-SVID minted by
// one replica validates against the JWT bundle served by any other.
//
// The keys live in one Secret in the CA's namespace (DefaultSecretName,
// type SecretType, the encoded Set under DataKey). Every replica watches
// it, loads each valid version and keeps the last good one when a version
// does not parse (jwtkeys.Parse is the trust boundary: size, key count,
// P-256 private keys named by their thumbprint). Only the replica that
// holds the Lease DefaultLeaseName writes: it creates the Secret, rotates
// the Set when a key stops signing or a retired key leaves the bundle, and
// rewrites a Secret that was deleted or does not parse with the last good
// keys it loaded (so tokens already issued keep validating). Its writes carry the
// resourceVersion it read, so a former leader's late write fails with a
// conflict instead of overwriting newer keys.
//
// A replica that is not the leader never needs to write: the next key is
// in the Secret one key lifetime before it signs, so every replica switches
// to it at the same time, from the Set alone.
//
// The RBAC it needs, in the CA's namespace only: secrets get, list, watch
// and update with resourceNames [meshid-jwt-keys] (list and watch carry a
// field selector on the name), create on secrets, and leases
// (coordination.k8s.io) get and update with resourceNames
// [meshid-jwt-keys], plus create.
package jwtsecret
