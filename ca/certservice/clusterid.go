package certservice

import (
	"context"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/cluster"
)

// ClusterIDKey is the request metadata key that names the caller's
// cluster (pilot-agent sends ISTIO_META_CLUSTER_ID in it).
const ClusterIDKey = "ClusterID"

// clusterID reads ClusterID from the request metadata: "" when absent or
// empty; InvalidArgument when it is not a string or not a cluster ID
// (cluster.CheckID: at most 253 bytes of letters, digits, '-', '_', '.').
func clusterID(md *structpb.Struct) (string, error) {
	v, ok := md.GetFields()[ClusterIDKey]
	if !ok {
		return "", nil
	}
	str, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return "", ca.Errorf(ca.KindInvalidArgument, "metadata %s must be a string (a cluster ID)", ClusterIDKey)
	}
	if str.StringValue == "" {
		return "", nil
	}
	if err := cluster.CheckID(str.StringValue); err != nil {
		return "", ca.Wrap(ca.KindInvalidArgument, err, "metadata "+ClusterIDKey+": "+err.Error())
	}
	return str.StringValue, nil
}

// clusterIDHeader reads ClusterID from the gRPC request headers, where
// pilot-agent also sends it and where a JWT-SVID request (whose message has
// no metadata) carries it: "" when absent or empty; InvalidArgument when it
// is sent more than once or is not a cluster ID. The same value then routes
// the request as CreateCertificate's metadata does (ca/cluster Router).
func clusterIDHeader(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(strings.ToLower(ClusterIDKey))
	switch {
	case len(vals) == 0 || (len(vals) == 1 && vals[0] == ""):
		return "", nil
	case len(vals) > 1:
		return "", ca.Errorf(ca.KindInvalidArgument, "header %s sent %d times", ClusterIDKey, len(vals))
	}
	if err := cluster.CheckID(vals[0]); err != nil {
		return "", ca.Wrap(ca.KindInvalidArgument, err, "header "+ClusterIDKey+": "+err.Error())
	}
	return vals[0], nil
}
