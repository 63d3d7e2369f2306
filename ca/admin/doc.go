// Package admin is the CA's local admin API: HTTP over a Unix socket (mode
// 0600, never a network address), through which an operator on the CA's
// host drives a CA rotation (`meshid certs activate`, `meshid certs
// rotate-root`) and sees where it stands (`meshid certs status`). Being
// reachable only by the socket's owner (and root) is its authentication.
//
//	GET  /v1/status       the rotation's Status as JSON
//	POST /v1/activate     activate the prepared CA now
//	POST /v1/rotate-root  prepare a new self-signed root
//
// Errors are JSON {"error": "..."}: 409 when the step does not apply (nothing
// prepared, already prepared, a plugged CA), 405 for a wrong method, 413 for
// a request body, 503 while the CA waits for its Secret.
package admin
