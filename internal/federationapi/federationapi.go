package federationapi

import (
	"context"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
)

// ServiceName is the gRPC service's full name.
const ServiceName = "meshid.v1.FederationService"

// FetchFederatedBundlesMethod is the method's full name.
const FetchFederatedBundlesMethod = "/" + ServiceName + "/FetchFederatedBundles"

// Server is the CA side of the service.
type Server interface {
	// FetchFederatedBundles returns the bundle of every federated trust
	// domain (see the package comment).
	FetchFederatedBundles(context.Context, *workloadpb.X509BundlesRequest) (*workloadpb.X509BundlesResponse, error)
}

// ServiceDesc describes the service for grpc.Server.RegisterService.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*Server)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "FetchFederatedBundles", Handler: fetchHandler}},
	Metadata:    "meshid/federation.proto",
}

// Register registers srv on s.
func Register(s grpc.ServiceRegistrar, srv Server) { s.RegisterService(&ServiceDesc, srv) }

// fetchHandler is the unary handler protoc-gen-go-grpc would generate.
func fetchHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(workloadpb.X509BundlesRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(Server).FetchFederatedBundles(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: FetchFederatedBundlesMethod}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(Server).FetchFederatedBundles(ctx, req.(*workloadpb.X509BundlesRequest))
	})
}

// Client is the agent side of the service.
type Client struct{ cc grpc.ClientConnInterface }

// NewClient returns a client on cc.
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{cc: cc} }

// FetchFederatedBundles calls the method of that name.
func (c *Client) FetchFederatedBundles(ctx context.Context, in *workloadpb.X509BundlesRequest, opts ...grpc.CallOption) (*workloadpb.X509BundlesResponse, error) {
	out := new(workloadpb.X509BundlesResponse)
	if err := c.cc.Invoke(ctx, FetchFederatedBundlesMethod, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}
