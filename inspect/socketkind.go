package inspect

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The kinds of socket socketKind recognises, as an error names them.
const (
	kindSDS         = "an SDS socket (Envoy's secret discovery): read it with --sds"
	kindWorkloadAPI = "a SPIFFE Workload API socket: read it with --workload-api"
)

// probeTimeout bounds socketKind.
const probeTimeout = 2 * time.Second

// probes are one method of each API inspect reads: a server that has the
// service answers anything but Unimplemented (an error for the empty
// request, or the missing Workload API header, is still an answer).
var probes = []struct{ method, kind string }{
	{"/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets", kindSDS},
	{"/SpiffeWorkloadAPI/FetchX509Bundles", kindWorkloadAPI},
}

// socketKind says which of the APIs inspect reads the gRPC server on the
// Unix socket serves, or "" when it serves none of them (or does not
// answer within probeTimeout). It is asked only after a fetch failed with
// Unimplemented, to tell the user which flag reads that socket.
func socketKind(ctx context.Context, socket string) string {
	conn, err := grpc.NewClient("passthrough:///probe",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		return ""
	}
	defer conn.Close()
	for _, p := range probes {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := conn.Invoke(pctx, p.method, &emptypb.Empty{}, &emptypb.Empty{})
		cancel()
		switch status.Code(err) {
		case codes.Unimplemented, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		default:
			return p.kind
		}
	}
	return ""
}
