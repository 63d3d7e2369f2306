// Package pkcs11 gives the CA a signing key that lives in a hardware
// security module (or any PKCS#11 token, SoftHSM2 in tests) and never
// leaves it: the private key is used through the module's C_Sign, through
// github.com/ThalesGroup/crypto11 over github.com/miekg/pkcs11.
//
// A key is named by an RFC 7512 URI:
//
//	pkcs11:token=meshid;object=ca-key?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=/etc/meshid/hsm-pin
//
// ParseURI accepts a strict subset of RFC 7512 (see URI) and reads the PIN
// only from a file (pin-source), never from the URI itself, so it never
// appears in a command line or a log.
//
// Key is a crypto.Signer for ca.Authority and keystore.LoadDirSigner; its
// Sign errors wrap keystore.ErrKeyUnavailable, so a module that fails while
// the CA runs fails each request with Unavailable instead of crashing the
// CA. The CA verifies every signature a Key makes (ca/sign.go). Generate
// creates a key; Destroy erases one (an upstream-minted intermediate's key
// once it no longer signs, ca/upstream.ModuleKeys); List reads which keys
// a token holds, without any leaving it.
//
// The module is a C library loaded with dlopen, so Open needs cgo. A
// CGO_ENABLED=0 build compiles (open_nocgo.go) and refuses pkcs11: URIs with
// a clear error.
package pkcs11
