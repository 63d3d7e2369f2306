package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// world is the CA and agents that `meshid server` and `meshid agent` run
// (the ca/caserver and sds/agent assemblies) in process, sharing one clock.
//
// With a fake clock, the world starts a week in the past. The CA signs
// with the fake time, while TLS handshakes with the CA check its serving
// certificate against the real time: a serving certificate issued at a
// fake time that the clock has been advanced to must still be valid in real
// time, and it is as long as the fake time stays behind the real one.
type world struct {
	clock  clock.Clock
	fake   *clock.Fake // nil for the real clock
	dir    string      // short: tokens and sockets
	caDir  string      // the CA's state directory: its self-signed root
	issuer *devissuer.Issuer
}

// fakeStart is how far in the past a fake world starts.
const fakeStart = 7 * 24 * time.Hour

// servingTTL keeps the CA's serving certificate valid in real time over
// every advance of a fake clock.
const servingTTL = 60 * 24 * time.Hour

// newWorld creates the CA side of a world, on a fake clock when fake is set.
func newWorld(t *testing.T, fake bool) *world {
	t.Helper()
	w := &world{clock: clock.Real{}, dir: testkit.ShortDir(t), caDir: t.TempDir()}
	if fake {
		w.fake = clock.NewFake(time.Now().Add(-fakeStart).Truncate(time.Second))
		w.clock = w.fake
	}
	var err error
	if w.issuer, err = devissuer.LoadOrCreate(w.dir, "https://meshid.dev.local"); err != nil {
		t.Fatal(err)
	}
	return w
}

// caServer is a running CA.
type caServer struct {
	addr string
	stop func()
}

// startCA serves the world's CA on addr ("127.0.0.1:0" for a free port)
// until stop is called or the test ends. A CA started again on the same
// world loads the same root from its state directory, as a restarted
// `meshid server` does.
func (w *world) startCA(t *testing.T, addr string) *caServer {
	t.Helper()
	srv, err := caserver.New(caserver.Config{
		Listen:      addr,
		TrustDomain: td,
		StateDir:    w.caDir,
		Authn: caserver.AuthnConfig{
			JWTIssuer:        w.issuer.Issuer(),
			JWKSFile:         filepath.Join(w.dir, devissuer.JWKSFile),
			MaxTokenLifetime: agentTokenTTL,
		},
		// startAgent's tokens live 30 days, so that the fake clock can run
		// through rotations without a kubelet refreshing them.
		Serving: caserver.ServingConfig{
			CertTTL: servingTTL,
		},
		Clock:  caClock{w.clock},
		Logger: discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	c := &caServer{addr: srv.Addr().String()}
	c.stop = testkit.Start(t, "CA", srv.Run)
	t.Cleanup(c.stop)
	return c
}

// caClock is the world's time for the CA, without its timers: the CA signs
// and verifies at the world's (fake) time, while its periodic work (the
// JWKS refresh) waits in real time, so that the agents' rotation
// schedulers are the only timers on a fake clock (what parked relies on).
type caClock struct{ clock.Clock }

func (caClock) NewTimer(d time.Duration) clock.Timer { return clock.Real{}.NewTimer(d) }

// agentProc is a running agent (sds/agent), as `meshid agent` runs it.
type agentProc struct {
	id      spiffeid.ID
	manager *secretcache.Manager
	reg     *prometheus.Registry
	sock    string
	sds     secretv3.SecretDiscoveryServiceClient
}

// agentTokenTTL is the lifetime of the tokens startAgent mints.
const agentTokenTTL = 30 * 24 * time.Hour

// startAgent runs an agent for namespace/serviceAccount against the CA at
// caAddr, with a token from the world's issuer. ttl is the requested
// certificate lifetime.
func (w *world) startAgent(t *testing.T, caAddr, namespace, serviceAccount string, ttl time.Duration) *agentProc {
	t.Helper()
	name := namespace + "-" + serviceAccount
	tok, err := w.issuer.Mint(namespace, serviceAccount, []string{"istio-ca"}, agentTokenTTL, w.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(w.dir, name+".token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &agentProc{reg: prometheus.NewRegistry(), sock: filepath.Join(w.dir, name+".sock")}
	ag := testkit.RunAgent(t, agent.Config{
		CAAddr:      caAddr,
		CARootFile:  filepath.Join(w.caDir, "root-cert.pem"),
		TokenFile:   tokenFile,
		SDSSocket:   a.sock,
		CertTTL:     ttl,
		TrustDomain: td,
		Clock:       w.clock,
		Logger:      discard,
		Registerer:  a.reg,
	})
	a.manager, a.id = ag.Manager(), ag.Manager().ID()
	// The agent fetches its first certificate at once; wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := a.manager.Secret(ctx, secretcache.DefaultName); err != nil {
		t.Fatalf("first certificate for %s: %v", a.id, err)
	}
	a.sds = sdsClient(t, a.sock)
	return a
}

// counter returns the sum of a counter's values in reg (0 if absent).
func counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
