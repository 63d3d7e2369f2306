package jwtissuer_test

import (
	"testing"

	"github.com/meshid/meshid/ca/jwtissuer"
)

// BenchmarkIssue: one JWT-SVID minted (ES256 signature, JSON, base64).
func BenchmarkIssue(b *testing.B) {
	i, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil {
		b.Fatal(err)
	}
	aud := []string{"orders"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := i.Issue(id, aud); err != nil {
			b.Fatal(err)
		}
	}
}
