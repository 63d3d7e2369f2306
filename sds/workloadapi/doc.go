// Package workloadapi serves the SPIFFE Workload API (the SpiffeWorkloadAPI
// service of go-spiffe v2's proto) on the agent's Unix socket, from the same
// SecretManager cache as SDS: FetchX509SVID and FetchX509Bundles subscribe
// through the Manager's Watch, so a rotation reaches Envoy over SDS and the
// application over the Workload API from one event.
//
// Every call must carry the workload.spiffe.io: true metadata (the SPIFFE
// Workload Endpoint specification), or it is refused with InvalidArgument.
// Concurrent streams and connections are capped (Config.MaxStreams,
// Config.MaxConnections). The JWT methods answer Unimplemented: the CA has no
// JWT-SVID endpoint yet.
package workloadapi
