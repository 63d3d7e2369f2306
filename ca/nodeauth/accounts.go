package nodeauth

import (
	"fmt"
	"strings"

	"github.com/meshid/meshid/identity"
)

// ParseTrustedAccounts parses the --trusted-node-accounts list (Istio's
// CA_TRUSTED_NODE_ACCOUNTS format): namespace/service-account pairs
// separated by commas, e.g. "istio-system/ztunnel,kube-system/ztunnel".
// Spaces around an entry and empty entries are ignored, duplicates are
// dropped; an entry that is not exactly <namespace>/<name> is an error.
// An empty list gives nil: node mode off.
func ParseTrustedAccounts(s string) ([]identity.ServiceAccount, error) {
	var out []identity.ServiceAccount
	seen := map[identity.ServiceAccount]bool{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		ns, name, ok := strings.Cut(entry, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("nodeauth: trusted node account %q is not <namespace>/<service-account>", entry)
		}
		sa := identity.ServiceAccount{Namespace: ns, Name: name}
		if !seen[sa] {
			seen[sa] = true
			out = append(out, sa)
		}
	}
	return out, nil
}
