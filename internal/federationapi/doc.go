// Package federationapi is the gRPC contract by which the agent receives
// the federated trust domains' bundles from the CA: the service
// meshid.v1.FederationService with one unary method,
// FetchFederatedBundles, whose messages are the SPIFFE Workload API's
// X509BundlesRequest and X509BundlesResponse (go-spiffe v2's generated
// proto/spiffe/workload). In the response, bundles maps each federated
// trust domain's SPIFFE ID ("spiffe://<td>") to its SPIFFE bundle, the
// JSON document its bundle endpoint served (x509-svid and jwt-svid keys,
// refresh hint, sequence); the CA's own trust domain is never in it.
//
// As internal/jwtapi, the descriptor is written by hand (no protoc) and
// shared by ca/certservice and sds/caclient; it imports no meshid package.
package federationapi
