package sdsserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/sds/secretcache"
)

// The status of every refused SDS request is made here, so that one kind
// of failure always has one code:
//   - InvalidArgument: a request that is malformed whatever the agent
//     holds (another type, FetchSecrets without names).
//   - ResourceExhausted: more names than Config.MaxResourceNames.
//   - NotFound: a name the agent cannot serve, including a file that is
//     absent or outside the allowed directories (one message for both).
//   - Unavailable: a known name that cannot be produced now.

func errWrongType(typeURL string) error {
	return status.Errorf(codes.InvalidArgument, "sds: type_url %q is not %s", typeURL, SecretTypeURL)
}

func errNoNames() error {
	return status.Error(codes.InvalidArgument, "sds: FetchSecrets needs resource_names")
}

// tooManyNames is the error for a request naming n resources, or a stream
// that would subscribe to n, above the limit.
func (s *Server) tooManyNames(n int) error {
	return status.Errorf(codes.ResourceExhausted, "sds: %d resource names, more than the limit of %d", n, s.maxNames)
}

// fetchError is the status of a failed Source.Secret in FetchSecrets.
func (s *Server) fetchError(name string, err error) error {
	switch {
	case errors.Is(err, secretcache.ErrUnknownResource):
		s.metrics.bad.WithLabelValues(reasonUnknownResource).Inc()
		s.fetchWarn("SDS fetch of an unknown resource", "resource", name)
		// The cause is left out: it would tell an absent file from a
		// refused one. The hint for file names is the same in every case.
		hint := ""
		if strings.HasPrefix(name, secretcache.FileCertPrefix) || strings.HasPrefix(name, secretcache.FileRootPrefix) {
			hint = ": no such regular file under the agent's --file-secret-dirs (a relative path is relative to the agent's working directory)"
		}
		return status.Errorf(codes.NotFound, "sds: unknown resource %q%s", name, hint)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "sds: %q is not available yet", name)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "sds: fetch of %q canceled", name)
	}
	// The cause may name the CA's error or a file's defect; it never holds
	// a key or token.
	return status.Error(codes.Unavailable, fmt.Sprintf("sds: %q is not available: %v", name, err))
}
