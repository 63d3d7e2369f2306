package workloadendpoint_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/workloadendpoint"
	"github.com/meshid/meshid/testkit"
)

// The SVID served is the Manager's certificate, its key matches, and the
// bundle is the Manager's roots under the trust domain.
func TestFetchX509SVIDAndBundles(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	ctx := guardCtx(t)

	svid, err := workloadapi.FetchX509SVID(ctx, a.addr())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := a.m.Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := a.m.Secret(ctx, secretcache.RootName)
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != a.id {
		t.Fatalf("SVID ID %s, want %s", svid.ID, a.id)
	}
	if len(svid.Certificates) != len(cert.Chain) {
		t.Fatalf("chain of %d certificates, want %d", len(svid.Certificates), len(cert.Chain))
	}
	for i := range cert.Chain {
		if !svid.Certificates[i].Equal(cert.Chain[i]) {
			t.Fatalf("certificate %d differs from the Manager's", i)
		}
	}
	// go-spiffe checked that the key matches the leaf; check it is the
	// Manager's key.
	if !cert.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(svid.PrivateKey.Public()) {
		t.Fatal("SVID key is not the Manager's key")
	}

	bundles, err := workloadapi.FetchX509Bundles(ctx, a.addr())
	if err != nil {
		t.Fatal(err)
	}
	if bundles.Len() != 1 {
		t.Fatalf("%d bundles, want 1", bundles.Len())
	}
	b, ok := bundles.Get(td)
	if !ok {
		t.Fatalf("no bundle for %s", td)
	}
	if !slices.EqualFunc(b.X509Authorities(), roots.Roots, (*x509.Certificate).Equal) {
		t.Fatal("bundle differs from the Manager's roots")
	}
	// The SVID verifies against the served bundle.
	if _, _, err := x509svid.Verify(svid.Certificates, bundles); err != nil {
		t.Fatalf("SVID does not verify against the bundle: %v", err)
	}

	xc, err := workloadapi.FetchX509Context(ctx, a.addr())
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := xc.Bundles.Get(td); !ok || !slices.EqualFunc(b.X509Authorities(), roots.Roots, (*x509.Certificate).Equal) {
		t.Fatal("X509Context bundle differs from the Manager's roots")
	}
}

// A rotation driven by the fake clock reaches an X509Source and a
// WatchX509Context watcher without their reconnecting, from the same
// Manager event that SDS watches.
func TestRotationPushed(t *testing.T) {
	a := newAgent(t, nil, nil, "app", nil)
	ctx := guardCtx(t)

	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(a.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	first, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}

	client, err := workloadapi.New(ctx, a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	updates := make(chan *workloadapi.X509Context, 10)
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- client.WatchX509Context(wctx, watcher{updates})
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()
	if got := recv(t, updates); !got.DefaultSVID().Certificates[0].Equal(first.Certificates[0]) {
		t.Fatal("watcher's first update is not the current SVID")
	}
	sdsSeen := make(chan *secretcache.Secret, 10)
	defer a.m.Watch(secretcache.DefaultName, func(s *secretcache.Secret) { sdsSeen <- s })()

	updated := src.Updated()
	a.rotate(t)

	select {
	case <-updated:
	case <-ctx.Done():
		t.Fatal("X509Source not updated after the rotation")
	}
	second, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	if second.Certificates[0].Equal(first.Certificates[0]) {
		t.Fatal("X509Source still holds the old certificate")
	}
	if second.ID != a.id {
		t.Fatalf("rotated SVID ID %s", second.ID)
	}
	got := recv(t, updates)
	if !got.DefaultSVID().Certificates[0].Equal(second.Certificates[0]) {
		t.Fatal("watcher did not get the rotated certificate")
	}
	var pushed *secretcache.Secret
	select {
	case pushed = <-sdsSeen:
	case <-ctx.Done():
		t.Fatal("no Manager push")
	}
	if !pushed.Chain[0].Equal(second.Certificates[0]) {
		t.Fatal("the Workload API served another certificate than the Manager pushed")
	}
	// One rotation, one update: the roots did not change.
	select {
	case u := <-updates:
		t.Fatalf("extra update after one rotation (serial %s)", u.DefaultSVID().Certificates[0].SerialNumber)
	default:
	}
}

type watcher struct{ ch chan *workloadapi.X509Context }

func (w watcher) OnX509ContextUpdate(c *workloadapi.X509Context) { w.ch <- c }
func (w watcher) OnX509ContextWatchError(error)                  {}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	ctx := guardCtx(t)
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatal("nothing received")
	}
	var zero T
	return zero
}

// Two agents' SVIDs, fetched over the Workload API by go-spiffe sources,
// make an mTLS connection authorised by SPIFFE ID; a client expecting
// another ID refuses the server.
func TestMTLSBetweenTwoAgents(t *testing.T) {
	// Two agents of one mesh: one CA, one clock.
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	authority := testkit.NewAuthority(t, td, clk, nil)
	a := newAgent(t, authority, clk, "server", nil)
	b := newAgent(t, authority, clk, "client", nil)
	ctx := guardCtx(t)
	srvSrc, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(a.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer srvSrc.Close()
	cliSrc, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(b.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cliSrc.Close()
	serverID, clientID := a.id, b.id

	handshake := func(expectServer spiffeid.ID) (spiffeid.ID, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		peer := make(chan spiffeid.ID, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				peer <- spiffeid.ID{}
				return
			}
			defer c.Close()
			tc := tls.Server(c, tlsconfig.MTLSServerConfig(srvSrc, srvSrc, tlsconfig.AuthorizeID(clientID)))
			if err := tc.HandshakeContext(ctx); err != nil {
				peer <- spiffeid.ID{}
				return
			}
			id, _ := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0])
			peer <- id
			tc.Write([]byte("x"))
		}()
		c, err := tls.Dial("tcp", ln.Addr().String(), tlsconfig.MTLSClientConfig(cliSrc, cliSrc, tlsconfig.AuthorizeID(expectServer)))
		if err != nil {
			<-peer
			return spiffeid.ID{}, err
		}
		defer c.Close()
		buf := make([]byte, 1)
		if _, err := c.Read(buf); err != nil {
			return spiffeid.ID{}, err
		}
		return <-peer, nil
	}
	got, err := handshake(serverID)
	if err != nil {
		t.Fatalf("mTLS between the two agents' SVIDs: %v", err)
	}
	if got != clientID {
		t.Fatalf("server saw client %s, want %s", got, clientID)
	}
	if _, err := handshake(spiffeid.RequireFromPath(td, "/ns/default/sa/other")); err == nil {
		t.Fatal("client accepted a server with another SPIFFE ID")
	}
}

// The socket is created 0600 and removed when Run ends, and its streams
// end with it.
func TestSocketModeAndShutdown(t *testing.T) {
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	m, err := secretcache.New(secretcache.Config{
		Signer: testkit.AuthoritySigner{Authority: testkit.NewAuthority(t, td, clk, nil)},
		ID:     spiffeid.RequireFromPath(td, "/ns/default/sa/app"),
		Clock:  clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testkit.ShortDir(t), "workload.sock")
	srv, err := workloadendpoint.New(workloadendpoint.Config{Source: m, SocketPath: path, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	stop := testkit.Start(t, "workloadapi", srv.Run)
	defer stop()
	<-srv.Ready()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket mode %v, want 0600 socket", fi.Mode())
	}
	ctx := guardCtx(t)
	stream, err := raw(t, path).FetchX509SVID(withHeader(ctx), &workloadpb.X509SVIDRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream after shutdown: %v, want Unavailable", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// Bad configurations are refused by New.
func TestNewRefusesBadConfig(t *testing.T) {
	m, err := secretcache.New(secretcache.Config{
		Signer: testkit.AuthoritySigner{},
		ID:     spiffeid.RequireFromPath(td, "/ns/default/sa/app"),
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Refuses(t, workloadendpoint.New, workloadendpoint.Config{Source: m, SocketPath: "/tmp/x.sock"}, map[string]func(*workloadendpoint.Config){
		"no source":          func(c *workloadendpoint.Config) { c.Source = nil },
		"no path":            func(c *workloadendpoint.Config) { c.SocketPath = "" },
		"long path":          func(c *workloadendpoint.Config) { c.SocketPath = "/tmp/" + strings.Repeat("a", 120) },
		"mode for others":    func(c *workloadendpoint.Config) { c.SocketMode = 0o666 },
		"mode without owner": func(c *workloadendpoint.Config) { c.SocketMode = 0o060 },
		"negative streams":   func(c *workloadendpoint.Config) { c.MaxStreams = -1 },
		"negative conns":     func(c *workloadendpoint.Config) { c.MaxConnections = -1 },
		"negative shutdown":  func(c *workloadendpoint.Config) { c.ShutdownTimeout = -1 },
	})
}

// The group option: 0660 lets the group connect, and the directory the
// agent creates for the socket lets the group in too.
func TestSocketGroupMode(t *testing.T) {
	a := newAgent(t, nil, nil, "app", func(c *workloadendpoint.Config) {
		c.SocketPath = filepath.Join(testkit.ShortDir(t), "sub", "workload.sock")
		c.SocketMode = 0o660
	})
	fi, err := os.Stat(a.path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v, want 0660", fi.Mode())
	}
	di, err := os.Stat(filepath.Dir(a.path))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o750 {
		t.Fatalf("socket directory mode %v, want 0750", di.Mode())
	}
	if _, err := workloadapi.FetchX509SVID(guardCtx(t), a.addr()); err != nil {
		t.Fatal(err)
	}
}
