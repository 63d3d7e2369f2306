package cluster

import (
	"fmt"
	"strings"
)

// DefaultLocalID is the local cluster's ID when none is configured: the
// default of Istio's CLUSTER_ID.
const DefaultLocalID = "Kubernetes"

// MaxIDLength is the longest cluster ID: 253 bytes, the longest data key
// of a Kubernetes Secret (where remote secrets name their clusters).
const MaxIDLength = 253

// UnknownLabel is the cluster label of a request naming a cluster that is
// not configured.
const UnknownLabel = "unknown"

// CheckID returns an error when id cannot be a cluster ID: empty, longer
// than MaxIDLength, or with a character other than the ones a Secret's
// data key allows (ASCII letters, digits, '-', '_', '.'). The error quotes
// at most the first 64 bytes of id.
func CheckID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("empty cluster ID")
	case len(id) > MaxIDLength:
		return fmt.Errorf("cluster ID of %d bytes, more than %d", len(id), MaxIDLength)
	}
	if i := strings.IndexFunc(id, func(r rune) bool { return !idChar(r) }); i >= 0 {
		return fmt.Errorf("cluster ID %q has a character at byte %d other than letters, digits, '-', '_' and '.'", clip(id), i)
	}
	return nil
}

func idChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
}

// clip shortens caller input quoted in a message or a log.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return strings.ToValidUTF8(s, "?")
	}
	return strings.ToValidUTF8(s[:max], "?") + "..."
}

// ParseKubeconfigs turns ID=PATH pairs (meshid server --remote-kubeconfig)
// into the Router's Kubeconfigs: nil for none; a pair without an ID or a
// path, or an ID given twice, is refused. The IDs are checked by NewRouter.
func ParseKubeconfigs(pairs []string) (map[string]string, error) {
	var out map[string]string
	for _, kv := range pairs {
		id, path, ok := strings.Cut(kv, "=")
		if !ok || id == "" || path == "" {
			return nil, fmt.Errorf("%q: want ID=PATH", clip(kv))
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("cluster %s given twice", clip(id))
		}
		if out == nil {
			out = map[string]string{}
		}
		out[id] = path
	}
	return out, nil
}
