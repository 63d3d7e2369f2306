package secretcache

import (
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/identity"
)

// IdentityFromToken returns the SPIFFE ID an unverified service-account
// token names (see identity.IDFromToken).
//
// Deprecated: use identity.IDFromToken. It remains only for
// cmd/meshid/agent.go until the agent's assembly moves out of cmd.
func IdentityFromToken(token string, td spiffeid.TrustDomain) (spiffeid.ID, error) {
	return identity.IDFromToken(token, td)
}
