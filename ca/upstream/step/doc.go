// Package step is the upstream.Authority of a step-ca CA
// (github.com/smallstep/certificates): step+https://HOST:PORT?provisioner=NAME&ca=PATH,
// the intermediate signed by step-ca's /1.0/sign with a one-time token of a
// JWK provisioner whose x509 template issues CA certificates, the trust
// bundle from /1.0/roots.
package step
