package e2e_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/server"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
)

// world is the CA and agents of cmd/meshid wired in process (as
// buildCA and buildAgent wire them), sharing one clock.
//
// With a fake clock, the world starts a week in the past. The CA signs
// with the fake time, while TLS handshakes with the CA check its serving
// certificate against the real time: a serving certificate issued at a
// fake time that the clock has been advanced to must still be valid in real
// time, and it is as long as the fake time stays behind the real one.
type world struct {
	clock     clock.Clock
	fake      *clock.Fake // nil for the real clock
	dir       string      // short: tokens and sockets
	authority *ca.Authority
	authn     authn.Authenticator
	issuer    *devissuer.Issuer
}

// fakeStart is how far in the past a fake world starts.
const fakeStart = 7 * 24 * time.Hour

// servingTTL keeps the CA's serving certificate valid in real time over
// every advance of a fake clock.
const servingTTL = 60 * 24 * time.Hour

// newWorld creates the CA side of a world, on a fake clock when fake is set.
func newWorld(t *testing.T, fake bool) *world {
	t.Helper()
	w := &world{clock: clock.Real{}, dir: shortDir(t)}
	if fake {
		w.fake = clock.NewFake(time.Now().Add(-fakeStart).Truncate(time.Second))
		w.clock = w.fake
	}
	w.authority = newAuthority(t, w.clock)
	var err error
	if w.issuer, err = devissuer.LoadOrCreate(w.dir, "https://meshid.dev.local"); err != nil {
		t.Fatal(err)
	}
	jwt, err := authn.NewJWT(authn.JWTConfig{
		Issuer:    w.issuer.Issuer(),
		Audiences: []string{"istio-ca"},
		JWKSFile:  filepath.Join(w.dir, devissuer.JWKSFile),
		// startAgent's tokens live 30 days, so that the fake clock can run
		// through rotations without a kubelet refreshing them.
		MaxTokenLifetime: agentTokenTTL,
		Clock:            w.clock,
		Logger:           discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := authn.NewClientCert(authn.ClientCertConfig{
		TrustDomain: td,
		Roots:       func() []*x509.Certificate { return w.authority.Bundle().Roots },
		Clock:       w.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.authn = authn.NewChain(jwt, cc)
	return w
}

// caServer is a running ca/server.Server.
type caServer struct {
	addr string
	stop func()
}

// startCA serves the world's CA on addr ("127.0.0.1:0" for a free port)
// until stop is called or the test ends.
func (w *world) startCA(t *testing.T, addr string) *caServer {
	t.Helper()
	srv, err := server.New(server.Config{
		Authority:     w.authority,
		Authenticator: w.authn,
		Listen:        addr,
		ServingTTL:    servingTTL,
		Logger:        discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	c := &caServer{addr: srv.Addr().String()}
	c.stop = runUntilStopped(t, "CA server", srv.Run)
	t.Cleanup(c.stop)
	return c
}

// agent is a running SecretManager serving SDS, as `meshid agent` wires it.
type agent struct {
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
func (w *world) startAgent(t *testing.T, caAddr, namespace, serviceAccount string, ttl time.Duration) *agent {
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
	id, err := identity.IDFromToken(tok, td)
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{id: id, reg: prometheus.NewRegistry(), sock: filepath.Join(w.dir, name+".sock")}
	client, err := caclient.New(caclient.Config{
		Addr:       caAddr,
		Roots:      w.authority.Bundle().Roots,
		TokenFile:  tokenFile,
		Clock:      w.clock,
		Logger:     discard,
		Registerer: a.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	a.manager, err = secretcache.New(secretcache.Config{
		Signer:     client,
		ID:         id,
		KeyType:    certs.ECP256,
		TTL:        ttl,
		Clock:      w.clock,
		Logger:     discard,
		Registerer: a.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sds.New(sds.Config{
		Source:     a.manager,
		SocketPath: a.sock,
		Clock:      w.clock,
		Logger:     discard,
		Registerer: a.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runUntilStopped(t, "SDS server", srv.Run))
	t.Cleanup(runUntilStopped(t, "secret manager", a.manager.Run))
	// Like the agent command, fetch the first certificate at once.
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := a.manager.Secret(ctx, secretcache.DefaultName); err != nil {
		t.Fatalf("first certificate for %s: %v", id, err)
	}
	a.sds = sdsClient(t, a.sock)
	return a
}

// runUntilStopped runs run in a goroutine; the returned function cancels
// it, waits for it and checks that it returned nil. It may be called more
// than once.
func runUntilStopped(t *testing.T, what string, run func(context.Context) error) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wait := time.NewTimer(guard)
			defer wait.Stop()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case <-wait.C:
				t.Errorf("%s did not stop within %v", what, guard)
			}
		})
	}
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
