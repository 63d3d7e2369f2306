// Package inspect explains certificates the way an operator debugging mesh
// identity needs: what is being served, is it valid, and when does it
// expire. It parses PEM inputs (certificates, chains, keys, CSRs and CA
// directories), checks them against a time and optional trusted roots,
// names every failure in words (expired, not yet valid, unknown issuer, name
// mismatch, key/cert mismatch, non-SPIFFE leaf), and renders a report as a
// table, as detail text, as stable JSON or as PEM.
//
// The package does no I/O besides reading the paths it is given; fetching
// secrets over SDS lives in sds/sdsfetch, and the command wiring in
// cmd/meshid.
package inspect
