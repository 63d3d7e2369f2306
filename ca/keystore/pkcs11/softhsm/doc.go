// Package softhsm gives tests a real PKCS#11 module: a SoftHSM2 token
// initialised in a temporary directory for one test, with its own
// configuration (SOFTHSM2_CONF) and PIN file.
//
// SoftHSM2 comes from the Debian package softhsm2 (`make softhsm` installs
// it; .ci/run does so in CI). Where it is missing a test is skipped, except
// under CI=true, where it fails: the PKCS#11 tests must never silently not
// run in CI.
package softhsm
