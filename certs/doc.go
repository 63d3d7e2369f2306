// Package certs holds the X.509 helpers shared by the CA, the agent and the
// CLI: key generation by name, PEM encoding at the edges, CSR construction,
// CA certificate templates, chain verification, renewal policy and atomic
// file writes. Values stay typed inside meshid; PEM appears only here.
package certs
