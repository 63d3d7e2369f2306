// Package unixsock creates the agent's Unix sockets (SDS, SPIFFE Workload
// API) with their mode set before anyone can connect, replaces a stale
// socket left by a dead agent, refuses to start beside a live one, and
// removes only its own socket at shutdown. Server is the life of a gRPC
// server on such a socket (listen, a connection cap, serve, a bounded stop,
// removal) and NewGRPC that server with the limits every agent socket has
// (header list size, request size, streams per connection, streams and
// unary calls over the socket), shared by sds and sds/workloadendpoint so that
// the two sockets' limits cannot drift apart.
package unixsock
