package certservice_test

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// streamWorkers counts the goroutines parked in or running gRPC's stream
// worker loop, in every server of this process.
func streamWorkers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("grpc.(*Server).serverWorker("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitStreamWorkers waits (at most 10 s of real time, polling without
// sleeping) until exactly want workers run: those of servers stopped by
// earlier tests end asynchronously after their Stop.
func waitStreamWorkers(t *testing.T, want int) {
	t.Helper()
	got := -1
	ok := clock.Within(clock.Real{}, 10*time.Second, func() {
		for got = streamWorkers(); got != want; got = streamWorkers() {
			runtime.Gosched()
		}
	})
	if !ok {
		t.Fatalf("%d stream workers run, want %d", streamWorkers(), want)
	}
}

// TestStreamWorkers: the server keeps Config.StreamWorkers goroutines to
// serve requests (DefaultStreamWorkers when unset), and requests leave
// them in place.
func TestStreamWorkers(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  int
		want int
	}{
		{"default", 0, certservice.DefaultStreamWorkers},
		{"configured", 37, 37},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{cfg: func(c *certservice.Config) { c.StreamWorkers = tc.set }})
			waitStreamWorkers(t, tc.want)
			c := e.client(t, "localhost", nil)
			for range 3 {
				if _, err := c.CreateCertificate(withToken(context.Background(), e.token(t, "shop", "cart")),
					&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)}); err != nil {
					t.Fatal(err)
				}
			}
			waitStreamWorkers(t, tc.want)
		})
	}
}
