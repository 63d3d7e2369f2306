// Package skew is the version-skew suite (docs/upgrading.md, "Which
// versions work together"): the CA and the agent of the previous release
// against those of this tree, through their binaries.
//
// The previous release is the newest section of CHANGELOG.md that names
// its commit. Its cmd/meshid and cmd/meshid-agent are built from that
// commit (git archive into a temporary directory, so the repository's own
// worktrees and index are untouched) once, and cached under the user's
// cache directory (~/.cache/meshid/skew/<commit>/), so CI builds them once
// per release. Without the git history (a shallow clone, an exported
// tarball) the suite skips, and fails under CI=true, which must have it.
//
// Two directions, each a real CA process, a real agent process and Envoy's
// SDS asked over the agent's Unix socket (sds/sdsfetch, as a proxy asks):
// the previous release's agent gets its certificate from the current CA,
// and the current agent from the previous release's CA. Authentication is
// the offline JWT one (--jwt-issuer, --jwks-file) with tokens of
// internal/devissuer, which both releases accept.
package skew
