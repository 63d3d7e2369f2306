// Package secretdump is the read-only view of what a node agent serves,
// for operators: the workload certificate chain and the roots, as PEM in
// JSON, never a private key (the types have no field that could hold one).
// The agent serves it at /debug/secrets on its monitoring listener, to
// loopback peers only; `meshid inspect --pod` reads it through a
// port-forward.
package secretdump
