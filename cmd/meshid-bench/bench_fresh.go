package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshid/meshid/bench/caload"
	"github.com/meshid/meshid/bench/freshtokens"
	"github.com/meshid/meshid/identity"
)

// freshRun is a --fresh-tokens run: the pods and tokens minted before the
// clock starts, and the API server's request counters around the run.
type freshRun struct {
	fleet  *freshtokens.Fleet
	client kubernetes.Interface
	before map[string]float64
}

// prepareFresh mints --fresh-tokens pod-bound tokens through the API
// server of --kubeconfig and returns one identity per token.
func prepareFresh(ctx context.Context, f *benchCAFlags, td spiffeid.TrustDomain, stderr io.Writer) ([]caload.Identity, *freshRun, error) {
	switch {
	case f.kubeconfig == "":
		return nil, nil, errors.New("bench ca: --fresh-tokens needs --kubeconfig")
	case f.caRoot == "":
		return nil, nil, errors.New("bench ca: --fresh-tokens needs --ca-root")
	case f.tokenFile != "" || f.devStateDir != "" || f.sweep != "":
		return nil, nil, errors.New("bench ca: --fresh-tokens excludes --token-file, --dev-state-dir and --sweep (a token is fresh once)")
	case f.requests > f.freshTokens:
		return nil, nil, fmt.Errorf("bench ca: --requests %d is more than --fresh-tokens %d", f.requests, f.freshTokens)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("bench ca: --kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = 1000, 2000 // minting, before the clock starts: not the measured CA
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("bench ca: %w", err)
	}
	fleet, err := freshtokens.New(freshtokens.Config{Client: client, Count: f.freshTokens, Namespace: f.namespace, Audience: f.audience})
	if err != nil {
		return nil, nil, fmt.Errorf("bench ca: %w", err)
	}
	if !f.quiet {
		fmt.Fprintf(stderr, "bench ca: minting %d pod-bound tokens in namespace %s\n", f.freshTokens, fleet.Namespace())
	}
	toks, err := fleet.Mint(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("bench ca: %w", err)
	}
	id, err := identity.ServiceAccount{Namespace: fleet.Namespace(), Name: fleet.ServiceAccount()}.ID(td)
	if err != nil {
		return nil, nil, fmt.Errorf("bench ca: %w", err)
	}
	ids := make([]caload.Identity, len(toks))
	for i, tok := range toks {
		ids[i] = caload.Identity{ID: id, Token: tok}
	}
	f.requests = len(ids) // one CSR per token
	return ids, &freshRun{fleet: fleet, client: client}, nil
}

// start reads the API server's counters just before the clock starts.
func (r *freshRun) start(ctx context.Context) (err error) {
	r.before, err = freshtokens.Requests(ctx, r.client)
	return err
}

// finish reads them again and returns the requests made during the run by
// resource, without the bench's own reads of /metrics; the pods are
// deleted.
func (r *freshRun) finish(ctx context.Context) (map[string]float64, error) {
	after, err := freshtokens.Requests(ctx, r.client)
	if err != nil {
		return nil, err
	}
	d := freshtokens.Delta(r.before, after)
	if d[""]--; d[""] <= 0 { // the bench's first /metrics read
		delete(d, "")
	}
	return d, r.fleet.Cleanup(ctx)
}

// formatRequests is "tokenreviews=1000 pods=2" (sorted), or "none".
func formatRequests(d map[string]float64, csrs int) string {
	if len(d) == 0 {
		return "none"
	}
	var parts []string
	total := 0.0
	for _, k := range slices.Sorted(maps.Keys(d)) {
		name := k
		if name == "" {
			name = "(non-resource)"
		}
		parts = append(parts, fmt.Sprintf("%s=%.0f", name, d[k]))
		total += d[k]
	}
	return fmt.Sprintf("%s (%.1f per 1,000 CSRs)", strings.Join(parts, " "), total*1000/float64(max(csrs, 1)))
}
