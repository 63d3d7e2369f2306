package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/meshid/meshid/test/kube/harness"
)

// cluster is the one real etcd + kube-apiserver every test in this package
// shares; tests isolate themselves with their own namespaces.
var cluster *harness.Cluster

// staticUser is a --token-auth-file user: authenticated by the API server,
// but not a service account.
var staticUser = harness.StaticToken{Token: "static-user-token-0123456789abcdef", User: "alice", UID: "alice-uid", Groups: []string{"developers"}}

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "meshid-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = tmp
	start := time.Now()
	code := harness.Main(m, harness.Config{
		// istio-ca is an API audience so that the static user's token
		// passes the API server's own review: the CA's check that the
		// caller is a service account is then what rejects it.
		APIAudiences: []string{"istio-ca"},
		StaticTokens: []harness.StaticToken{staticUser},
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}, func(_ context.Context, c *harness.Cluster) error {
		fmt.Fprintf(os.Stderr, "e2e: cluster ready at %s in %s\n", c.Host(), time.Since(start).Round(time.Millisecond))
		cluster = c
		return nil
	})
	os.RemoveAll(tmp)
	os.Exit(code)
}
