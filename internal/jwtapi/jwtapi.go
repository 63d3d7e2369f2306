package jwtapi

import (
	"context"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
)

// ServiceName is the gRPC service's full name.
const ServiceName = "meshid.v1.JWTSVIDService"

// Full method names.
const (
	MintJWTSVIDMethod     = "/" + ServiceName + "/MintJWTSVID"
	FetchJWTBundlesMethod = "/" + ServiceName + "/FetchJWTBundles"
)

// Server is the CA side of the service.
type Server interface {
	// MintJWTSVID returns one JWT-SVID for the identity the caller
	// proved, for the request's audiences. A request's spiffe_id, when
	// set, must be that identity.
	MintJWTSVID(context.Context, *workloadpb.JWTSVIDRequest) (*workloadpb.JWTSVIDResponse, error)
	// FetchJWTBundles returns the JWKS of the CA's trust domain, keyed by
	// the trust domain's SPIFFE ID ("spiffe://<td>").
	FetchJWTBundles(context.Context, *workloadpb.JWTBundlesRequest) (*workloadpb.JWTBundlesResponse, error)
}

// ServiceDesc describes the service for grpc.Server.RegisterService.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*Server)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "MintJWTSVID", Handler: handler(MintJWTSVIDMethod, Server.MintJWTSVID)},
		{MethodName: "FetchJWTBundles", Handler: handler(FetchJWTBundlesMethod, Server.FetchJWTBundles)},
	},
	Metadata: "meshid/jwtsvid.proto",
}

// Register registers srv on s.
func Register(s grpc.ServiceRegistrar, srv Server) { s.RegisterService(&ServiceDesc, srv) }

// handler is the unary handler protoc-gen-go-grpc would generate for call.
func handler[Req, Resp any](method string, call func(Server, context.Context, *Req) (*Resp, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := new(Req)
		if err := dec(in); err != nil {
			return nil, err
		}
		if interceptor == nil {
			return call(srv.(Server), ctx, in)
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: method}
		return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
			return call(srv.(Server), ctx, req.(*Req))
		})
	}
}

// Client is the agent side of the service.
type Client struct{ cc grpc.ClientConnInterface }

// NewClient returns a client on cc.
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{cc: cc} }

// MintJWTSVID calls the method of that name.
func (c *Client) MintJWTSVID(ctx context.Context, in *workloadpb.JWTSVIDRequest, opts ...grpc.CallOption) (*workloadpb.JWTSVIDResponse, error) {
	out := new(workloadpb.JWTSVIDResponse)
	if err := c.cc.Invoke(ctx, MintJWTSVIDMethod, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// FetchJWTBundles calls the method of that name.
func (c *Client) FetchJWTBundles(ctx context.Context, in *workloadpb.JWTBundlesRequest, opts ...grpc.CallOption) (*workloadpb.JWTBundlesResponse, error) {
	out := new(workloadpb.JWTBundlesResponse)
	if err := c.cc.Invoke(ctx, FetchJWTBundlesMethod, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}
