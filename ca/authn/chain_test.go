package authn_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
)

type authFunc func(context.Context, authn.Credentials) (*authn.Caller, error)

func (f authFunc) Authenticate(ctx context.Context, c authn.Credentials) (*authn.Caller, error) {
	return f(ctx, c)
}

func accept(ns string) authn.Authenticator {
	return authFunc(func(context.Context, authn.Credentials) (*authn.Caller, error) {
		return &authn.Caller{Namespace: ns, ServiceAccount: "sa", Method: ns}, nil
	})
}

func fail(err error) authn.Authenticator {
	return authFunc(func(context.Context, authn.Credentials) (*authn.Caller, error) { return nil, err })
}

func TestChain(t *testing.T) {
	noCreds := fail(authn.ErrNoCredentials)
	unauth := fail(ca.Errorf(ca.KindUnauthenticated, "x: bad token"))
	unauth2 := fail(ca.Errorf(ca.KindUnauthenticated, "y: expired"))
	unavail := fail(ca.Errorf(ca.KindUnavailable, "z: api down"))
	internal := fail(errors.New("boom secret-token-text"))
	tests := []struct {
		name     string
		auths    []authn.Authenticator
		wantNS   string
		wantKind ca.Kind
		wantMsg  []string
		notMsg   []string
	}{
		{"first accepts", []authn.Authenticator{accept("a"), accept("b")}, "a", 0, nil, nil},
		{"skips no credentials", []authn.Authenticator{noCreds, accept("b")}, "b", 0, nil, nil},
		{"rejection then accept", []authn.Authenticator{unauth, accept("b")}, "b", 0, nil, nil},
		{"unavailable then accept", []authn.Authenticator{unavail, accept("b")}, "b", 0, nil, nil},
		{"nothing", nil, "", ca.KindUnauthenticated, []string{"no credentials"}, nil},
		{"all no credentials", []authn.Authenticator{noCreds, noCreds}, "", ca.KindUnauthenticated, []string{"no credentials"}, nil},
		{"rejections joined", []authn.Authenticator{unauth, noCreds, unauth2, unauth}, "", ca.KindUnauthenticated, []string{"x: bad token; y: expired"}, nil},
		{"unavailable wins over rejection", []authn.Authenticator{unauth, unavail}, "", ca.KindUnavailable, []string{"api down"}, nil},
		{"unclassified error hidden", []authn.Authenticator{internal}, "", ca.KindUnauthenticated, []string{"authenticator failed"}, []string{"secret-token-text"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := authn.NewChain(tc.auths...).Authenticate(context.Background(), authn.Credentials{Token: "t"})
			if tc.wantNS != "" {
				if err != nil || c.Namespace != tc.wantNS {
					t.Fatalf("got %+v, %v; want namespace %q", c, err, tc.wantNS)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted %+v, want error", c)
			}
			if got := ca.KindOf(err); got != tc.wantKind {
				t.Fatalf("kind %v, want %v (%v)", got, tc.wantKind, err)
			}
			var e *ca.Error
			errors.As(err, &e)
			for _, m := range tc.wantMsg {
				if !strings.Contains(e.Msg, m) {
					t.Errorf("message %q lacks %q", e.Msg, m)
				}
			}
			for _, m := range tc.notMsg {
				if strings.Contains(e.Msg, m) {
					t.Errorf("message %q contains %q", e.Msg, m)
				}
			}
		})
	}
}

// TestChainKeepsCause: the message hides an unclassified error's text, but
// the error still wraps the first failure, so the log line of the refusal
// (which prints the cause) says what went wrong.
func TestChainKeepsCause(t *testing.T) {
	boom := errors.New("boom secret-token-text")
	second := ca.Errorf(ca.KindUnauthenticated, "y: expired")
	_, err := authn.NewChain(fail(boom), fail(second)).Authenticate(context.Background(), authn.Credentials{Token: "t"})
	if ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("err = %v, want Unauthenticated", err)
	}
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v does not wrap the first failure", err)
	}
}
