package ca

import (
	"errors"
	"fmt"

	"github.com/meshid/meshid/ca/keystore"
)

// Kind classifies a CA error. The gRPC server maps each Kind to one status
// code (see ca/certservice).
type Kind int

// Error kinds.
const (
	KindInternal          Kind = iota // a bug or an unexpected failure
	KindInvalidArgument               // a bad PEM, bad signature, weak key, forbidden extension, TTL too long
	KindPermissionDenied              // an identity the caller may not have
	KindUnauthenticated               // no credential, or a credential that does not verify
	KindUnavailable                   // the CA or a dependency (the Kubernetes API) is not ready
	KindResourceExhausted             // rate limited
)

func (k Kind) String() string {
	switch k {
	case KindInvalidArgument:
		return "invalid_argument"
	case KindPermissionDenied:
		return "permission_denied"
	case KindUnauthenticated:
		return "unauthenticated"
	case KindUnavailable:
		return "unavailable"
	case KindResourceExhausted:
		return "resource_exhausted"
	}
	return "internal"
}

// Error is a classified CA error. Msg is safe to return to the caller: it
// never contains a token or key material.
type Error struct {
	Kind Kind
	Msg  string
	Err  error // the cause, for logs; may be nil
}

func (e *Error) Error() string {
	if e.Err != nil {
		return "ca: " + e.Msg + ": " + e.Err.Error()
	}
	return "ca: " + e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error of kind k with a formatted message.
func Errorf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error of kind k with message msg and cause err. A cause
// that is a signing key held outside the process failing (a PKCS#11 module,
// keystore.ErrKeyUnavailable) is KindUnavailable whatever k says.
func Wrap(k Kind, err error, msg string) error {
	if errors.Is(err, keystore.ErrKeyUnavailable) {
		k = KindUnavailable
	}
	return &Error{Kind: k, Msg: msg, Err: err}
}

// KindOf returns the Kind of err, or KindInternal when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}
