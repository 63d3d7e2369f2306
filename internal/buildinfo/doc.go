// Package buildinfo is the version of the running binary: its version,
// commit, Go version and build date, from -ldflags -X overrides or else
// runtime/debug.ReadBuildInfo, and the meshid_build_info gauge that carries
// them. It is a leaf package (standard library and Prometheus only), so the
// lean agent links it.
package buildinfo
