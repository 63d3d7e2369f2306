package boundtoken

import (
	"context"
	"fmt"
	"testing"

	"github.com/meshid/meshid/bench/cputime"
	"github.com/meshid/meshid/ca/authn"
)

// BenchmarkAuthenticate is the verifier's CPU per token: cold (a token
// never seen: ES256 signature, claims, informer lookups) and warm (the
// signature cache hit; the pod and service account are still checked).
//
//	go test -run '^$' -bench . -benchmem ./ca/authn/boundtoken
func BenchmarkAuthenticate(b *testing.B) {
	for _, tc := range []struct {
		name string
		size int
	}{{"cold", -1}, {"warm", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b, func(c *Config) { c.CacheSize = tc.size })
			toks := make([]string, 256)
			for i := range toks {
				cl := tokenClaims(t0)
				cl["jti"] = fmt.Sprint(i)
				toks[i] = e.genuine(b, cl)
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
