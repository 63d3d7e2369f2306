package multicluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/meshid/meshid/test/kube/harness"
)

// clusterA runs the CA; clusterB is remote. Each has its own issuer and
// service-account key, so neither API server accepts the other's tokens.
var clusterA, clusterB *harness.Cluster

const (
	idA    = "cluster-a"
	idB    = "cluster-b"
	issuer = "https://kubernetes.default.svc.cluster-b.local"
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := harness.Boot(ctx, harness.Config{Logger: log.With("cluster", idA)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer a.Stop()
	b, err := harness.Boot(ctx, harness.Config{Issuer: issuer, Logger: log.With("cluster", idB)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer b.Stop()
	fmt.Fprintf(os.Stderr, "multicluster: clusters ready at %s and %s in %s\n", a.Host(), b.Host(), time.Since(start).Round(time.Millisecond))
	clusterA, clusterB = a, b
	return m.Run()
}
