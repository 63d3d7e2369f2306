// Package caserver assembles the certificate authority that `meshid server`
// runs: the CA material (a plugged-in directory, a self-signed root in a
// state directory, or the Kubernetes Secret of ca/kube), the ca.Authority,
// the authenticators (TokenReview, offline JWT, client certificates, and any
// extra ones), the gRPC server of ca/certservice and the monitoring listener.
//
// A Config holds every option as a typed value with its defaults; New
// validates it and builds the parts; Run serves until its context ends.
// cmd/meshid only turns flags and environment into a Config, and tests run
// the same assembly.
package caserver
