// Package catool is the offline CA tooling behind `meshid certs`: it
// creates a root CA directory, an intermediate CA directory in Istio's
// cacerts layout (the layout `meshid server --ca-dir` loads), and leaves
// for tests and debugging.
//
// Root and intermediate certificates are made with cfssl the way its
// initca does it (csr.Generate, then cfssl's local signer under a CA
// signing profile), with the validity window taken from the injected clock
// rather than cfssl's time.Now. Leaves are signed by ca.Authority, the
// signing code the CA itself runs, so a minted leaf is exactly what the CA
// would issue.
//
// Each command is a Config and one function. Errors name the `meshid
// certs` flag of the offending field, since the command line is the only
// caller.
package catool
