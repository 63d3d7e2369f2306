// Package e2e is the end-to-end suite of the main module. Its tests (package
// e2e_test) prove the "Done when" criteria of the CA, agent and tooling
// issues across real components:
//
//   - The real meshid binary, built once per run, as child processes:
//     `meshid dev` answered by the generated Istio CSR client and by
//     go-control-plane's SDS client; `meshid inspect` on the agent's socket
//     and on certificates created at run time; and the CA hierarchy round
//     trip `meshid certs root` → `certs intermediate` → `meshid server
//     --ca-dir` → `meshid agent` → `meshid inspect`.
//   - In process, the same assemblies the binaries run (ca/caserver, serving
//     over real TLS on 127.0.0.1, and sds/agent, serving SDS on a real Unix
//     socket), driven by a fake clock:
//     rotation before expiry, a CA outage and recovery, an mTLS handshake
//     between two agent identities with go-spiffe's tlsconfig, and two
//     meshes of different trust domains federated over https_spiffe.
//
// The package itself holds no code; the tests are black-box.
package e2e
