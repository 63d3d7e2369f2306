package jwtapi_test

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/testkit"
)

type fake struct{}

func (fake) MintJWTSVID(_ context.Context, r *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error) {
	if len(r.Audience) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no audience")
	}
	return &workloadpb.JWTSVIDResponse{Svids: []*workloadpb.JWTSVID{{SpiffeId: r.SpiffeId, Svid: r.Audience[0]}}}, nil
}

func (fake) FetchJWTBundles(context.Context, *workloadpb.JWTBundlesRequest) (*workloadpb.JWTBundlesResponse, error) {
	return &workloadpb.JWTBundlesResponse{Bundles: map[string][]byte{"spiffe://td": []byte(`{"keys":[]}`)}}, nil
}

// TestRoundTrip calls both methods through a real gRPC server and client,
// with an interceptor that records the full method names.
func TestRoundTrip(t *testing.T) {
	var seen []string
	intercept := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = append(seen, info.FullMethod)
		return h(ctx, req)
	}
	path := filepath.Join(testkit.ShortDir(t), "s.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(intercept))
	jwtapi.Register(srv, fake{})
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := jwtapi.NewClient(cc)
	resp, err := c.MintJWTSVID(t.Context(), &workloadpb.JWTSVIDRequest{Audience: []string{"aud"}, SpiffeId: "spiffe://td/x"})
	if err != nil || resp.Svids[0].Svid != "aud" || resp.Svids[0].SpiffeId != "spiffe://td/x" {
		t.Fatalf("MintJWTSVID = %v, %v", resp, err)
	}
	if _, err := c.MintJWTSVID(t.Context(), &workloadpb.JWTSVIDRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("error code lost: %v", err)
	}
	b, err := c.FetchJWTBundles(t.Context(), &workloadpb.JWTBundlesRequest{})
	if err != nil || string(b.Bundles["spiffe://td"]) != `{"keys":[]}` {
		t.Fatalf("FetchJWTBundles = %v, %v", b, err)
	}
	want := []string{jwtapi.MintJWTSVIDMethod, jwtapi.MintJWTSVIDMethod, jwtapi.FetchJWTBundlesMethod}
	if !slices.Equal(seen, want) {
		t.Errorf("interceptor saw %v, want %v", seen, want)
	}
}
