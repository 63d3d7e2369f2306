// Package agentflood attacks a running agent's sockets the ways issue 28
// found open, and measures what they cost it: FetchJWTSVID calls with
// distinct audiences from callers that give up after a short deadline
// (Workload API), SDS streams with huge headers, and many SDS streams on
// one connection. It reads the agent process's resident memory from /proc,
// its goroutines from a /debug/pprof/goroutine endpoint and the CA's
// JWT-SVID count from its /metrics, before the attack, right after it and
// after a settle time (what callers that left still cost).
package agentflood
