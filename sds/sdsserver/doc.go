// Package sdsserver serves the agent's secrets to Envoy over the Secret
// Discovery Service (envoy.service.secret.v3.SecretDiscoveryService) on a Unix socket.
// It implements all three methods: StreamSecrets (state of the world),
// DeltaSecrets (incremental) and FetchSecrets (unary).
//
// Secrets come from a Source, in practice the secretcache.Manager. The
// server maps them to Envoy resources: a certificate secret ("default",
// "file-cert:...") becomes a TlsCertificate with the inline PEM chain and
// PKCS#8 key, a root secret ("ROOTCA", "file-root:...") a
// CertificateValidationContext whose trusted_ca is the inline root bundle.
// A client whose first request carries the node metadata field
// MESHID_SPIFFE_VALIDATOR = true (a bool or the string "true") gets root
// secrets as Envoy's SPIFFE certificate validator instead
// (custom_validator_config envoy.tls.cert_validator.spiffe with the trust
// domain and its bundle).
//
// # Design
//
// The xDS logic is written here rather than taken from go-control-plane's
// cache and server packages, whose generated message and service types are
// used. Their snapshot cache is keyed by node and would hold one copy of the
// same secrets per proxy; their linear cache re-creates a watch and a
// response channel after every response and runs two goroutines per stream,
// and neither has a notion of a name that "does not exist yet" or a
// per-stream variant of a resource (the SPIFFE validator form). What this
// package needs is simpler and cheaper:
//
//   - Subscriptions are the Source's: each stream registers its own Watch
//     per subscribed name (secretcache.Manager.Watch is the one
//     subscription point, built for 10,000 watchers of a name, and shared
//     with any other consumer such as a Workload API), then fetches the
//     current secret on its handler goroutine. What streams share here is
//     the encoded-resource cache: the Envoy resource built for a name's
//     current version (and the PEM of the private key, which exists
//     nowhere else) is built once and sent by every stream, so a rotation
//     costs one encoding, not one per stream. A name's cache entry is
//     freed with its last subscription.
//   - A stream has no goroutine of its own while idle: gRPC's handler
//     goroutine blocks in Recv and answers requests itself, and a push
//     (from the Source's notification) starts a sender goroutine that
//     exits once nothing is left to send. So 10,000 idle streams cost
//     10,000 parked handler goroutines and a few hundred bytes of state
//     each, and a slow client delays only itself. A shared pool of
//     senders was rejected: a few clients that stop reading would block it
//     for everyone.
//   - State of the world: every response carries one resource, its version
//     as version_info and a fresh nonce. A request whose response_nonce is
//     not the latest sent is stale and ignored; one with the latest nonce is
//     an ACK, or a NACK when error_detail is set (logged and counted; the
//     rejected content is not sent again, only a newer version is). A
//     changed resource_names list subscribes the added names and drops the
//     removed ones; an empty list unsubscribes everything.
//   - Delta: subscribe and unsubscribe are applied whatever the nonce;
//     initial_resource_versions avoids resending what the client holds; a
//     name that is unknown is reported in removed_resources.
//   - A name that does not exist yet (secretcache.ErrNotReady) stays
//     subscribed and is sent when the Source reports it. An unknown name is
//     logged and counted and the stream stays up (a file that is absent or
//     outside the allowed directories is unknown, the same way, until it
//     appears). An expired certificate is never sent.
//
// # Limits
//
// A request naming more than Config.MaxResourceNames resources, or a delta
// stream that would subscribe to more, is refused with ResourceExhausted
// and its stream ends. Warnings a client causes (NACKs, unknown names,
// other types) are rate-limited per stream. Run's shutdown is bounded by
// Config.ShutdownTimeout. Errors map to gRPC codes in errors.go.
package sdsserver
