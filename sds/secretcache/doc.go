// Package secretcache is the agent's SecretManager: it holds the workload
// certificate ("default") and the trust roots ("ROOTCA") obtained from the
// CA, and file-mounted certificates ("file-cert:<cert>~<key>",
// "file-root:<path>").
//
// A Manager generates a key in memory, sends a CSR carrying exactly the
// workload's SPIFFE ID to a Signer (package caclient, which verifies the
// answer with caclient.Verify) and caches the answer. Concurrent first requests share one CSR. Run starts
// the rotation scheduler, which renews at NotBefore + GraceRatio × lifetime
// (± Jitter), retries CA failures with capped exponential backoff, and
// watches mounted files with fsnotify. Every change is pushed to the
// callbacks registered with Watch, which the SDS server turns into pushes to
// the streams that asked for the name.
//
// File resources are read only from Config.FileSecretDirs (regular files,
// at most Config.MaxFileSecretSize bytes, no symbolic link out of the
// directory); a file that is absent or refused is ErrUnknownResource, the
// same error either way. A watched file is one entry however its name is
// spelled, read once per change and freed, with its topic, on the last
// cancel of its Watches.
//
// All timing comes from the injected clock, so tests drive rotation, backoff
// and expiry with a fake clock.
package secretcache
