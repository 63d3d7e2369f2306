package sdsserver_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// runServer runs a Server for cfg until cancel, and returns its socket and
// Run's result.
func runServer(t *testing.T, cfg sdsserver.Config) (socket string, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cfg.SocketPath = filepath.Join(testkit.ShortDir(t), "sds.sock")
	srv, err := sdsserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan error, 1)
	go func() { ch <- srv.Run(ctx) }()
	return cfg.SocketPath, cancel, ch
}

// gatedSigner is the pki's signer, held until gate closes: a CA that does
// not answer.
type gatedSigner struct {
	p    *pki
	gate chan struct{}
}

func (g gatedSigner) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	<-g.gate
	return g.p.Sign(ctx, csr, ttl)
}

// The attack: clients that stop reading, streams and FetchSecrets calls
// waiting for a certificate the CA does not give, a subscribed FIFO. The
// end of Run's context (SIGTERM) still stops the server: Run returns nil
// within DefaultShutdownTimeout, bounded here by a context deadline rather
// than a sleep.
func TestShutdownWhateverClientsDo(t *testing.T) {
	p := newPKI(t, nil)
	dir := t.TempDir()
	// 20 bundles of 300 roots (about 200 KiB each), asked for by clients
	// that never read: the server's sends block on flow control.
	var bundle []*x509.Certificate
	for range 300 {
		bundle = append(bundle, p.roots()...)
	}
	var bundles []string
	for i := range 20 {
		path := filepath.Join(dir, fmt.Sprintf("bundle-%d.pem", i))
		if err := certs.WriteFileAtomic(path, certs.EncodeCertificates(bundle...), 0o600); err != nil {
			t.Fatal(err)
		}
		bundles = append(bundles, secretcache.FileRootPrefix+path)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	m, err := secretcache.New(secretcache.Config{Signer: gatedSigner{p: p, gate: gate}, ID: testID, FileSecretDirs: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "Manager", m.Run)
	logs := testkit.NewLogRecorder()
	socket, cancel, done := runServer(t, sdsserver.Config{Source: m, Logger: logs.Logger()})
	client := secretv3.NewSecretDiscoveryServiceClient(dial(t, socket))

	for i := range 5 {
		s := newSotw(t, client, nil) // never reads
		s.request(append(bundles, secretcache.FileRootPrefix+filepath.Join(dir, "fifo.pem"))...)
		w := newSotw(t, client, nil) // waits for default
		w.request(dflt)
		d := newDelta(t, client, nil)
		d.change([]string{dflt, fmt.Sprintf("unknown-%d", i)}, nil)
		go func() {
			_, _ = client.FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt}})
		}()
	}
	logs.WaitFor(t, "SDS stream opened", 15)
	cancel()
	ctx, stop := context.WithTimeout(context.Background(), sdsserver.DefaultShutdownTimeout)
	defer stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v; goroutines of ours:\n%s", err, ourStacks())
		}
	case <-ctx.Done():
		t.Fatalf("Run did not return within %v of its context's end; goroutines of ours:\n%s", sdsserver.DefaultShutdownTimeout, ourStacks())
	}
}

func ourStacks() string {
	var ours []string
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "meshid/sds.") {
			ours = append(ours, g)
		}
	}
	return strings.Join(ours, "\n\n")
}

// stuckSource never answers Secret, whatever its context says: a handler
// that does not end. Run still returns after ShutdownTimeout.
type stuckSource struct {
	entered chan struct{}
	release chan struct{}
}

func (s stuckSource) Secret(context.Context, string) (*secretcache.Secret, error) {
	s.entered <- struct{}{}
	<-s.release
	return nil, secretcache.ErrNotReady
}

func (s stuckSource) Watch(string, func(*secretcache.Secret)) func() { return func() {} }

func TestShutdownBounded(t *testing.T) {
	src := stuckSource{entered: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(src.release) })
	clk := clock.NewFake(time.Now())
	socket, cancel, done := runServer(t, sdsserver.Config{Source: src, Clock: clk})
	client := secretv3.NewSecretDiscoveryServiceClient(dial(t, socket))
	go func() {
		_, _ = client.FetchSecrets(context.Background(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{dflt}})
	}()
	<-src.entered
	cancel()
	testkit.WaitForTimers(t, clk, 1, "Run's shutdown timer")
	select {
	case err := <-done:
		t.Fatalf("Run returned before the timeout although a handler is stuck: %v", err)
	default:
	}
	clk.Add(sdsserver.DefaultShutdownTimeout)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "shutdown took longer than 5s") {
			t.Fatalf("Run = %v, want the shutdown time-out", err)
		}
	case <-time.After(testkit.Guard):
		t.Fatal("Run did not return after the shutdown timeout")
	}
}
