// Package storm holds the rotation-storm tests of issue 6: many agents'
// SecretManagers (sds/secretcache) on one fake clock against a real CA
// (ca.Authority, and ca/certservice over TLS with a per-caller rate limit). They
// show that renewal jitter spreads certificates issued at the same instant,
// that the CA answers a burst with ResourceExhausted and keeps serving, and
// that agents back off and still renew every certificate before it expires.
// The package has no code of its own; everything is in its tests.
package storm
