// Package workloadendpoint is the SPIFFE Workload Endpoint (the SPIFFE
// spec's name for what serves the Workload API; go-spiffe's workloadapi is
// its client): it serves the SpiffeWorkloadAPI service of go-spiffe v2's
// proto on the agent's Unix socket, from the same
// SecretManager cache as SDS: FetchX509SVID and FetchX509Bundles subscribe
// through the Manager's Watch, so a rotation reaches Envoy over SDS and the
// application over the Workload API from one event.
//
// Every call must carry the workload.spiffe.io: true metadata (the SPIFFE
// Workload Endpoint specification), or it is refused with InvalidArgument.
// Concurrent streams and connections are capped (Config.MaxStreams,
// Config.MaxConnections).
//
// The JWT methods use the same Manager (JWTSource): FetchJWTSVID returns the
// workload's JWT-SVID for the requested audiences (minted by the CA's
// meshid.v1.JWTSVIDService, cached per audience set until half its life);
// FetchJWTBundles streams the CA's JWKS, pushed again when it changes;
// ValidateJWTSVID checks a token against that bundle on the agent's clock.
// Bad audiences and tokens are InvalidArgument; a request for another
// SPIFFE ID is PermissionDenied; an agent without a CA for JWT-SVIDs answers
// Unavailable.
package workloadendpoint
