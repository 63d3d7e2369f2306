package certservice

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/ca"
)

// Code maps an error to its gRPC status code. It is the one place where
// ca.Kind becomes a code: InvalidArgument, PermissionDenied,
// Unauthenticated, Unavailable and ResourceExhausted keep their names;
// anything unclassified is Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var e *ca.Error
	if !errors.As(err, &e) {
		switch {
		case errors.Is(err, context.Canceled):
			return codes.Canceled
		case errors.Is(err, context.DeadlineExceeded):
			return codes.DeadlineExceeded
		}
		return codes.Internal
	}
	switch e.Kind {
	case ca.KindInvalidArgument:
		return codes.InvalidArgument
	case ca.KindPermissionDenied:
		return codes.PermissionDenied
	case ca.KindUnauthenticated:
		return codes.Unauthenticated
	case ca.KindUnavailable:
		return codes.Unavailable
	case ca.KindResourceExhausted:
		return codes.ResourceExhausted
	}
	return codes.Internal
}

// toStatus turns err into the status returned to the caller. The message is
// the *ca.Error's Msg, which by contract holds no token or key; the cause is
// kept for logs only. Unclassified errors say only "internal error".
func toStatus(err error) error {
	c := Code(err)
	var e *ca.Error
	msg := "internal error"
	switch {
	case errors.As(err, &e):
		msg = e.Msg
	case c == codes.Canceled || c == codes.DeadlineExceeded:
		msg = c.String()
	}
	return status.Error(c, msg)
}
