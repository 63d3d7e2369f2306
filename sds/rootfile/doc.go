// Package rootfile reads the agent's CA root file (--ca-root, in a cluster
// the mounted istio-ca-root-cert ConfigMap) with the limits that keep it
// the mesh's own roots: the roots it holds verify the CA's serving
// certificate and are pushed to Envoy as ROOTCA, which every workload's
// mTLS trusts. A system CA bundle there would make the mesh trust the whole
// public web PKI, so Read refuses the system bundle by name and any file of
// more than a few roots (DefaultMaxRoots; a system bundle holds 100-150).
package rootfile
