// Package connlimit caps the connections a listener holds open at once, in
// all and optionally per peer IP: the CA's gRPC listener and the agent's
// sockets (SDS, Workload API, through internal/unixsock) use it.
//
// A connection beyond a cap is closed as soon as it is accepted, and Accept
// goes on. golang.org/x/net/netutil's LimitListener is not used: it stops
// accepting at the limit, so excess clients queue in the kernel's backlog
// with no answer (and one finally accepted may find its connection stale),
// and it has no per-IP cap, so one peer can take every slot. Closing at
// once fails the client fast (gRPC's Unavailable) and it retries with its
// backoff.
package connlimit
