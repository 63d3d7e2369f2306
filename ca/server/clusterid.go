package server

import (
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
