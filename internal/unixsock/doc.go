// Package unixsock creates the agent's Unix sockets (SDS, SPIFFE Workload
// API) with their mode set before anyone can connect, replaces a stale
// socket left by a dead agent, refuses to start beside a live one, and
// removes only its own socket at shutdown. Server is the life of a gRPC
// server on such a socket (listen, serve, a bounded stop, removal), shared
// by sds and sds/workloadapi.
package unixsock
