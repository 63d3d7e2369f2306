package certservice_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/testkit"
)

// failingNodeAuth is a NodeAuthorizer whose answer for each impersonated
// identity is an error, as when its upstream (the Kubernetes API) fails.
// (An authenticator's errors are classified by authn's chain; a
// NodeAuthorizer's reach the handler as they are.)
type failingNodeAuth map[string]error

func (f failingNodeAuth) Authorize(_ context.Context, _ *authn.Caller, id spiffeid.ID) error {
	return f[id.String()]
}

// TestErrorStatus: the status a caller gets for each kind of failure, over
// real gRPC (toStatus, through CreateCertificate). A classified error
// keeps its message; a cancellation or deadline of the CA's own upstream
// call is reported by its code with the code's name as the message; any
// other error is Internal with "internal error". The cause's text (which
// may quote a token or an upstream's answer) never reaches the caller.
func TestErrorStatus(t *testing.T) {
	const secret = "upstream-said-s3cr3t"
	id := func(sa string) string { return sid("shop", sa).String() }
	na := failingNodeAuth{
		id("classified"): ca.Wrap(ca.KindUnavailable, errors.New(secret), "pod lookup unavailable, retry later"),
		id("plain"):      fmt.Errorf("pod lookup: %s", secret),
		id("canceled"):   fmt.Errorf("pod lookup %s: %w", secret, context.Canceled),
		id("deadline"):   fmt.Errorf("pod lookup %s: %w", secret, context.DeadlineExceeded),
	}
	e := newEnv(t, envOpts{
		auths: func(*env) []authn.Authenticator {
			return []authn.Authenticator{callers{"node": {Namespace: "istio-system", ServiceAccount: "ztunnel", Method: authn.MethodTokenReview}}}
		},
		cfg: func(c *certservice.Config) { c.NodeAuthorizer = na },
	})
	c := e.client(t, "localhost", nil)
	for _, tc := range []struct {
		token string
		code  codes.Code
		msg   string
	}{
		{"classified", codes.Unavailable, "pod lookup unavailable, retry later"},
		{"plain", codes.Internal, "internal error"},
		{"canceled", codes.Canceled, "Canceled"},
		{"deadline", codes.DeadlineExceeded, "DeadlineExceeded"},
	} {
		target := id(tc.token)
		_, err := c.CreateCertificate(withToken(context.Background(), "node"), impersonationRequest(t, target, map[string]any{certservice.ImpersonatedIdentityKey: target}))
		st := status.Convert(err)
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%s: %v %q, want %v %q", tc.token, st.Code(), st.Message(), tc.code, tc.msg)
		}
		if strings.Contains(st.Message(), secret) {
			t.Errorf("%s: the message quotes the cause: %q", tc.token, st.Message())
		}
		if got := testkit.Metric(t, e.reg, "meshid_ca_requests_total", "code", tc.code.String()); got != 1 {
			t.Errorf("meshid_ca_requests_total{code=%s} = %v, want 1", tc.code, got)
		}
	}
}
