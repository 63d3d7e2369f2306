package identity

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// UsernamePrefix starts the Kubernetes user name of a service account:
// system:serviceaccount:<namespace>:<name>.
const UsernamePrefix = "system:serviceaccount:"

// ServiceAccount names a Kubernetes service account.
type ServiceAccount struct {
	Namespace string
	Name      string
}

// String returns "<namespace>/<name>".
func (sa ServiceAccount) String() string { return sa.Namespace + "/" + sa.Name }

// Username returns the Kubernetes user name of the service account,
// system:serviceaccount:<namespace>:<name>.
func (sa ServiceAccount) Username() string { return UsernamePrefix + sa.Namespace + ":" + sa.Name }

// ID returns spiffe://<td>/ns/<namespace>/sa/<name>. Names that are not
// valid SPIFFE path segments (empty, ".", "..", "/" or characters outside
// [a-zA-Z0-9._-]) are an error, as is a zero trust domain.
func (sa ServiceAccount) ID(td spiffeid.TrustDomain) (spiffeid.ID, error) {
	if td.IsZero() {
		return spiffeid.ID{}, errors.New("identity: trust domain is required")
	}
	id, err := spiffeid.FromSegments(td, "ns", sa.Namespace, "sa", sa.Name)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("identity: service account %q/%q is not a valid SPIFFE path: %w", sa.Namespace, sa.Name, err)
	}
	return id, nil
}

// FromID returns the service account of a spiffe://<td>/ns/<namespace>/sa/<name>
// ID; any other path is an error. The trust domain is not checked.
func FromID(id spiffeid.ID) (ServiceAccount, error) {
	parts := strings.Split(id.Path(), "/")
	if len(parts) != 5 || parts[0] != "" || parts[1] != "ns" || parts[3] != "sa" || parts[2] == "" || parts[4] == "" {
		return ServiceAccount{}, fmt.Errorf("identity: %s is not of the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>", id)
	}
	return ServiceAccount{Namespace: parts[2], Name: parts[4]}, nil
}

// FromUsername splits the Kubernetes user name
// system:serviceaccount:<namespace>:<name>; ok is false for any other user.
func FromUsername(user string) (sa ServiceAccount, ok bool) {
	rest, found := strings.CutPrefix(user, UsernamePrefix)
	if !found {
		return ServiceAccount{}, false
	}
	ns, name, found := strings.Cut(rest, ":")
	if !found || ns == "" || name == "" || strings.Contains(name, ":") {
		return ServiceAccount{}, false
	}
	return ServiceAccount{Namespace: ns, Name: name}, true
}
