package authn_test

import (
	"strings"
	"testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
)

// TestCheckTokenSize: a token of exactly the limit passes, one byte more is
// refused Unauthenticated without echoing it, for the default limit and a
// smaller configured one.
func TestCheckTokenSize(t *testing.T) {
	for _, max := range []int{authn.MaxTokenSize, 1 << 10} {
		if err := authn.CheckTokenSize(strings.Repeat("a", max), max); err != nil {
			t.Fatalf("a token of exactly %d bytes refused: %v", max, err)
		}
		long := strings.Repeat("b", max+1)
		err := authn.CheckTokenSize(long, max)
		wantKind(t, err, ca.KindUnauthenticated, long)
		if !strings.Contains(err.Error(), "limit") {
			t.Fatalf("error %q does not name the limit", err)
		}
	}
}
