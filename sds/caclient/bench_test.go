package caclient_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshid/meshid/sds/caclient"
)

// BenchmarkSignRealCA is one CreateCertificate round trip from the agent's
// client to the real CA over loopback TLS: token read, request, signing,
// response parsing and verification (the CSR is prepared once).
func BenchmarkSignRealCA(b *testing.B) {
	r := startRealCA(b, 0)
	tok := filepath.Join(b.TempDir(), "token")
	r.token(tok, "default", "default")
	c, err := caclient.New(caclient.Config{Addr: r.localhostAddr(), Roots: r.roots, TokenFile: tok})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	_, csr := newCSR(b, workload)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.Sign(ctx, csr, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
