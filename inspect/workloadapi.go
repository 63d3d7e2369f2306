package inspect

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// OriginWorkloadAPI is an input read from the SPIFFE Workload API.
const OriginWorkloadAPI Origin = "workload-api"

// WorkloadAPI is the Source of FetchWorkloadAPI (--workload-api).
func WorkloadAPI(socket string, timeout time.Duration) Source {
	return func(ctx context.Context) ([]*Input, error) { return FetchWorkloadAPI(ctx, socket, timeout) }
}

// WorkloadAPIJWT is the JWTSource of `meshid inspect --workload-api`: the
// JWT bundle keys FetchWorkloadAPIJWTBundles reads from the socket.
func WorkloadAPIJWT(socket string, timeout time.Duration) JWTSource {
	return func(ctx context.Context) ([]JWTKey, error) { return FetchWorkloadAPIJWTBundles(ctx, socket, timeout) }
}

// FetchWorkloadAPI reads what the SPIFFE Workload API on the Unix socket
// serves an application, with go-spiffe's own client (so it works against
// meshid's agent and SPIRE alike): each X.509-SVID as a chain with its key,
// named "svid" ("svid:<hint>" when the server gives hints), verified against
// the bundle of its trust domain; and each bundle, named
// "bundle:<trust domain>". timeout bounds the whole fetch.
func FetchWorkloadAPI(ctx context.Context, socket string, timeout time.Duration) ([]*Input, error) {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("inspect: Workload API %s: %v", socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	x, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr("unix://"+abs))
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			if kind := socketKind(ctx, socket); kind != "" {
				return nil, fmt.Errorf("inspect: Workload API %s: not a SPIFFE Workload API server: this is %s", socket, kind)
			}
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("inspect: Workload API %s: nothing served within %s: %v", socket, timeout, err)
		}
		return nil, fmt.Errorf("inspect: Workload API %s: %v", socket, err)
	}
	var inputs []*Input
	for _, s := range x.SVIDs {
		name := "svid"
		if s.Hint != "" {
			name += ":" + s.Hint
		}
		in := &Input{Name: name, Origin: OriginWorkloadAPI, Certs: s.Certificates, Key: s.PrivateKey}
		if b, ok := x.Bundles.Get(s.ID.TrustDomain()); ok {
			in.Roots, in.RootsName = b.X509Authorities(), "bundle:"+b.TrustDomain().Name()
		}
		inputs = append(inputs, in)
	}
	for _, b := range x.Bundles.Bundles() { // sorted by trust domain
		inputs = append(inputs, &Input{Name: "bundle:" + b.TrustDomain().Name(), Origin: OriginWorkloadAPI, Certs: b.X509Authorities(), Bundle: true})
	}
	return inputs, nil
}
