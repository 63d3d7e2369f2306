// Package sdsload opens many Envoy-like SDS streams (StreamSecrets, state of
// the world) against an agent's Unix socket and measures what a proxy
// fleet sees:
//
//   - the time from opening a stream until it holds every subscribed
//     resource (by default "default" and "ROOTCA");
//   - the agent's resident memory before and after the streams are open,
//     read from /proc/<pid>/status when the agent's PID is known;
//   - after a forced rotation, the time until every stream holds a new
//     "default" certificate.
//
// Streams are spread over several gRPC connections (StreamsPerConn each),
// because a server may cap the concurrent streams of one HTTP/2 connection
// and one connection's flow-control window would be shared by every push.
// Each stream acknowledges every response as Envoy does, so the server sees
// real ACKs and nonces.
package sdsload
