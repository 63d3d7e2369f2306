// Package jwtapi is the gRPC contract between the agent and the CA for
// JWT-SVIDs: the service meshid.v1.JWTSVIDService with two unary methods,
// MintJWTSVID and FetchJWTBundles, whose messages are the SPIFFE Workload
// API's own (go-spiffe v2's proto/spiffe/workload JWTSVIDRequest,
// JWTSVIDResponse, JWTBundlesRequest, JWTBundlesResponse).
//
// Reusing generated messages means no protoc step: the service descriptor
// is written by hand here, in the shape protoc-gen-go-grpc generates, and
// both sides (ca/certservice and sds/caclient) use it, so the method names
// cannot drift. It imports no meshid package.
package jwtapi
