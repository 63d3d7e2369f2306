// Package upstream lets the organisation's CA (an "upstream", as SPIRE's
// UpstreamAuthority) mint and renew the meshid CA's intermediate: the
// Authority interface a backend implements (ca/upstream/cfssl), the
// parsing of --upstream URLs and of the credentials file, the checks of an
// upstream's answer, and the Renewer that mints at start, renews at a
// point of the intermediate's life and offers each new CA to ca/rotation.
// Each mint has a new key from a KeySource: SoftwareKeys (in memory, saved
// by the caller) or ModuleKeys (created in a PKCS#11 module, --ca-key,
// named in the state by KeyIDFile, destroyed once it no longer signs).
package upstream
