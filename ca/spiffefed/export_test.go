package spiffefed

import (
	"context"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// RefreshOnce fetches td's bundle once, as Run does at each refresh.
func (f *Federator) RefreshOnce(ctx context.Context, td spiffeid.TrustDomain) {
	f.refresh(ctx, f.byTD[td])
}
