package boundtoken

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/util/cache"

	"github.com/meshid/meshid/bench/cputime"
	"github.com/meshid/meshid/ca/authn"
)

// BenchmarkAuthenticate is the verifier's CPU per token: cold (a token
// never seen: signature, claims, informer lookups) and warm (the
// signature cache hit; the pod and service account are still checked).
// cold-gojose is the cold token parsed by go-jose alone (the code before
// compact.go, for an A/B in one run); cold-rs256 a token of an RSA-2048
// key, as most clusters sign.
//
//	go test -run '^$' -bench . -benchmem ./ca/authn/boundtoken
func BenchmarkAuthenticate(b *testing.B) {
	for _, tc := range []struct {
		name        string
		size        int
		rsa, goJOSE bool
	}{{"cold", -1, false, false}, {"cold-gojose", -1, false, true}, {"cold-rs256", -1, true, false}, {"warm", 0, false, false}} {
		b.Run(tc.name, func(b *testing.B) {
			e, rk := compactEnv(b)
			e.v.cache = nil
			if tc.size == 0 {
				e.v.cache = cache.NewLRUExpireCacheWithClock(DefaultCacheSize, e.clk)
			}
			e.v.goJOSEOnly = tc.goJOSE
			toks := make([]string, 256)
			for i := range toks {
				cl := tokenClaims(t0)
				cl["jti"] = fmt.Sprint(i)
				toks[i] = e.genuine(b, cl)
				if tc.rsa {
					toks[i] = signRaw(b, rk, `{"alg":"RS256","kid":"`+rsaKid(rk)+`"}`, mustJSON(b, cl))
				}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Rusage()
			for i := range b.N {
				if _, err := e.v.Authenticate(ctx, authn.Credentials{Token: toks[i%len(toks)]}); err != nil {
					b.Fatal(err)
				}
			}
			// CPU, not wall time: the shared machine's load stretches the
			// latter (informer goroutines are idle during the loop).
			b.ReportMetric(float64((cputime.Rusage()-cpu).Microseconds())/float64(b.N), "CPU-µs/op")
		})
	}
}
