// Package devstack is `meshid dev`: the CA (ca/caserver) on a self-signed
// root, the offline JWT issuer (internal/devissuer) standing in for
// Kubernetes, and the agent (sds/agent) serving SDS and the Workload API,
// in one process and one state directory. It is a third assembly, of the
// two others, linked only into the full meshid CLI.
package devstack
