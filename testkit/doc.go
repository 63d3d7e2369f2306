// Package testkit holds helpers shared by the tests of several meshid
// packages: running the CA and agent assemblies (CA, RunAgent: what the
// binaries run, so tests do not re-wire them) and single components until a
// test ends, short Unix socket directories, reading a metric from a
// registry, and recording logs.
//
// It is imported only by _test.go files, never by production code.
// Everything it makes (directories, records) is made at run time, and its
// waits are bounded by Guard instead of sleeping.
package testkit
