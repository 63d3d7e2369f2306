package testkit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/protobuf/proto"
)

// SecretTypeURL is the type URL of an SDS Secret.
var SecretTypeURL = "type.googleapis.com/" + string(proto.MessageName(&tlsv3.Secret{}))

// Workload is what a proxy holds after SDS: its SVID and the mesh bundle.
type Workload struct {
	ID     spiffeid.ID
	SVID   *x509svid.SVID
	Bundle *x509bundle.Bundle
}

// OnlyOn reports whether w's bundle is exactly root and its leaf chains to
// it.
func (w Workload) OnlyOn(root *x509.Certificate) bool {
	return w.OnlyOnAt(root, time.Now())
}

// OnlyOnAt is OnlyOn with the leaf verified at now (a fake clock's time).
func (w Workload) OnlyOnAt(root *x509.Certificate, now time.Time) bool {
	if w.SVID == nil || w.Bundle == nil {
		return false
	}
	auth := w.Bundle.X509Authorities()
	if len(auth) != 1 || !auth[0].Equal(root) {
		return false
	}
	only := x509bundle.FromX509Authorities(w.ID.TrustDomain(), []*x509.Certificate{root})
	_, _, err := x509svid.Verify(w.SVID.Certificates, only, x509svid.WithTime(now))
	return err == nil
}

// SDSProxy follows an agent's SDS stream the way Envoy does (one
// StreamSecrets stream for default and ROOTCA, every response ACKed) and
// holds what it was last served.
type SDSProxy struct {
	id spiffeid.ID

	mu  sync.Mutex
	w   Workload
	err error // why the stream ended, if it did
}

// FollowSDS opens the stream on the agent's SDS socket and keeps the proxy
// up to date until the test ends. It returns once both secrets arrived.
func FollowSDS(t testing.TB, sock string, id spiffeid.ID) *SDSProxy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := secretv3.NewSecretDiscoveryServiceClient(DialUnix(t, sock)).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &SDSProxy{id: id, w: Workload{ID: id}}
	ready := make(chan struct{})
	go p.run(s, ready)
	select {
	case <-ready:
	case <-time.After(Guard):
		t.Fatalf("%s: no default and ROOTCA within %v (%v)", id, Guard, p.Failure())
	}
	return p
}

type secretStream interface {
	Send(*discoveryv3.DiscoveryRequest) error
	Recv() (*discoveryv3.DiscoveryResponse, error)
}

func (p *SDSProxy) run(s secretStream, ready chan struct{}) {
	req := &discoveryv3.DiscoveryRequest{
		Node:    &corev3.Node{Id: "sidecar~10.0.0.1~" + p.id.Path() + "~cluster.local", Cluster: "e2e"},
		TypeUrl: SecretTypeURL, ResourceNames: []string{"default", "ROOTCA"},
	}
	for {
		if err := s.Send(req); err != nil {
			p.fail(err)
			return
		}
		r, err := s.Recv()
		if err != nil {
			p.fail(err)
			return
		}
		if err := p.apply(r); err != nil {
			p.fail(err)
			return
		}
		p.mu.Lock()
		if p.w.SVID != nil && p.w.Bundle != nil && ready != nil {
			close(ready)
			ready = nil
		}
		p.mu.Unlock()
		req = &discoveryv3.DiscoveryRequest{TypeUrl: SecretTypeURL, ResourceNames: req.ResourceNames, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}
	}
}

func (p *SDSProxy) apply(r *discoveryv3.DiscoveryResponse) error {
	for _, a := range r.GetResources() {
		sec := &tlsv3.Secret{}
		if err := a.UnmarshalTo(sec); err != nil {
			return err
		}
		switch sec.GetName() {
		case "default":
			tc := sec.GetTlsCertificate()
			svid, err := x509svid.Parse(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
			if err != nil {
				return err
			}
			p.mu.Lock()
			p.w.SVID = svid
			p.mu.Unlock()
		case "ROOTCA":
			b, err := x509bundle.Parse(p.id.TrustDomain(), sec.GetValidationContext().GetTrustedCa().GetInlineBytes())
			if err != nil {
				return err
			}
			p.mu.Lock()
			p.w.Bundle = b
			p.mu.Unlock()
		}
	}
	return nil
}

func (p *SDSProxy) fail(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
}

// Failure is why the stream ended; nil while it runs.
func (p *SDSProxy) Failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// ID is the proxy's identity.
func (p *SDSProxy) ID() spiffeid.ID { return p.id }

// Workload is what the proxy holds now.
func (p *SDSProxy) Workload() Workload {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.w
}

// Handshake connects client to server over TCP on loopback, each
// authorizing the other's SPIFFE ID with go-spiffe's tlsconfig, and
// exchanges one message. It returns each side's error and the IDs each side
// saw.
func Handshake(t testing.TB, server, client Workload, serverAllows, clientAllows spiffeid.ID) (serverErr, clientErr error, sawClient, sawServer spiffeid.ID) {
	t.Helper()
	return HandshakeAt(t, nil, server, client, serverAllows, clientAllows)
}

// HandshakeAt is Handshake with both sides verifying the peer's SVID at
// now() (a fake clock's time) instead of the real time; nil now is the
// real time, with go-spiffe's tlsconfig as is.
func HandshakeAt(t testing.TB, now func() time.Time, server, client Workload, serverAllows, clientAllows spiffeid.ID) (serverErr, clientErr error, sawClient, sawServer spiffeid.ID) {
	t.Helper()
	serverConf := tlsconfig.MTLSServerConfig(server.SVID, server.Bundle, tlsconfig.AuthorizeID(serverAllows))
	clientConf := tlsconfig.MTLSClientConfig(client.SVID, client.Bundle, tlsconfig.AuthorizeID(clientAllows))
	if now != nil {
		serverConf.VerifyPeerCertificate = verifyAt(now, server.Bundle, serverAllows)
		clientConf.VerifyPeerCertificate = verifyAt(now, client.Bundle, clientAllows)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), Guard)
	defer cancel()

	type side struct {
		err error
		id  spiffeid.ID
	}
	srvDone := make(chan side, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			srvDone <- side{err: err}
			return
		}
		defer conn.Close()
		tc := tls.Server(conn, serverConf)
		if err := tc.HandshakeContext(ctx); err != nil {
			srvDone <- side{err: err}
			return
		}
		id, err := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0])
		if err != nil {
			srvDone <- side{err: err}
			return
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(tc, buf); err != nil {
			srvDone <- side{err: err, id: id}
			return
		}
		_, err = tc.Write(buf)
		srvDone <- side{err: err, id: id}
	}()

	clientErr, sawServer = func() (error, spiffeid.ID) {
		d := tls.Dialer{Config: clientConf}
		conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err, spiffeid.ID{}
		}
		defer conn.Close()
		tc := conn.(*tls.Conn)
		id, err := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0])
		if err != nil {
			return err, spiffeid.ID{}
		}
		// With TLS 1.3 the server judges the client certificate after
		// the client's handshake returned: a refusal shows on the read.
		if _, err := tc.Write([]byte("ping")); err != nil {
			return err, id
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(tc, buf); err != nil {
			return err, id
		}
		if string(buf) != "ping" {
			t.Fatalf("echo %q", buf)
		}
		return nil, id
	}()
	if clientErr != nil {
		// The server may still wait for a client that gave up.
		ln.Close()
	}
	s := <-srvDone
	return s.err, clientErr, s.id, sawServer
}

// verifyAt is go-spiffe's peer verification (the SVID chains to the
// bundle, its ID is allowed) at now().
func verifyAt(now func() time.Time, b *x509bundle.Bundle, allowed spiffeid.ID) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		chain := make([]*x509.Certificate, 0, len(raw))
		for _, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return err
			}
			chain = append(chain, c)
		}
		id, _, err := x509svid.Verify(chain, b, x509svid.WithTime(now()))
		if err != nil {
			return err
		}
		if id != allowed {
			return fmt.Errorf("peer %s, want %s", id, allowed)
		}
		return nil
	}
}

// Handshakes makes handshakes between two followed proxies, the client
// authorizing the server's ID and the server the client's, and counts them
// with the first failure.
type Handshakes struct {
	Server, Client *SDSProxy
	// Now, when set, is the time both sides verify at (HandshakeAt).
	Now       func() time.Time
	N, Failed int
	First     string // the first failure, with the note given with it
}

// Try fails t if either SDS stream ended, then makes one handshake and
// counts it; note says where the test stands (for the first failure).
func (h *Handshakes) Try(t testing.TB, note string) {
	t.Helper()
	for _, p := range []*SDSProxy{h.Client, h.Server} {
		if err := p.Failure(); err != nil {
			t.Fatalf("%s: SDS stream ended: %v", p.ID(), err)
		}
	}
	sErr, cErr, _, _ := HandshakeAt(t, h.Now, h.Server.Workload(), h.Client.Workload(), h.Client.ID(), h.Server.ID())
	h.N++
	if sErr != nil || cErr != nil {
		h.Failed++
		if h.First == "" {
			h.First = fmt.Sprintf("handshake %d (%s): server: %v; client: %v", h.N, note, sErr, cErr)
		}
	}
}

// OnlyOn reports whether both proxies hold only root, with leaves that
// chain to it (at h.Now when set).
func (h *Handshakes) OnlyOn(root *x509.Certificate) bool {
	now := time.Now()
	if h.Now != nil {
		now = h.Now()
	}
	return h.Client.Workload().OnlyOnAt(root, now) && h.Server.Workload().OnlyOnAt(root, now)
}

// String sums the handshakes up.
func (h *Handshakes) String() string {
	if h.Failed == 0 {
		return fmt.Sprintf("%d handshakes, none failed", h.N)
	}
	return fmt.Sprintf("%d of %d handshakes failed; first: %s", h.Failed, h.N, h.First)
}
