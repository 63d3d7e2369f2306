package e2e_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// workload is what a proxy holds after SDS: its SVID and the mesh bundle.
type workload struct {
	id     spiffeid.ID
	svid   *x509svid.SVID
	bundle *x509bundle.Bundle
}

func workloadOf(t *testing.T, a *agentProc) workload {
	t.Helper()
	got := openSotw(t, a.sds, "default", "ROOTCA").recvNames("default", "ROOTCA")
	w := workload{id: a.id, svid: svidOf(t, got["default"]), bundle: bundleOf(t, got["ROOTCA"])}
	verifySVID(t, w.svid, w.bundle, time.Time{}, a.id)
	return w
}

// handshake connects client to server over TCP on loopback, each
// authorizing the other's SPIFFE ID with go-spiffe's tlsconfig, and
// exchanges one message. It returns each side's error and the IDs each side
// saw.
func handshake(t *testing.T, server, client workload, serverAllows, clientAllows spiffeid.ID) (serverErr, clientErr error, sawClient, sawServer spiffeid.ID) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
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
		tc := tls.Server(conn, tlsconfig.MTLSServerConfig(server.svid, server.bundle, tlsconfig.AuthorizeID(serverAllows)))
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
		d := tls.Dialer{Config: tlsconfig.MTLSClientConfig(client.svid, client.bundle, tlsconfig.AuthorizeID(clientAllows))}
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

// Issue 3: two identities from the agent stack complete an mTLS handshake
// with go-spiffe's tlsconfig authorizers, and a third identity is refused.
func TestMTLSBetweenAgentIdentities(t *testing.T) {
	w := newWorld(t, false)
	ca := w.startCA(t, "127.0.0.1:0")
	frontend := workloadOf(t, w.startAgent(t, ca.addr, "shop", "frontend", time.Hour))
	cart := workloadOf(t, w.startAgent(t, ca.addr, "shop", "cart", time.Hour))
	intruder := workloadOf(t, w.startAgent(t, ca.addr, "other", "intruder", time.Hour))

	t.Run("frontend to cart", func(t *testing.T) {
		serverErr, clientErr, sawClient, sawServer := handshake(t, cart, frontend, frontend.id, cart.id)
		if serverErr != nil || clientErr != nil {
			t.Fatalf("server: %v; client: %v", serverErr, clientErr)
		}
		if sawClient != frontend.id || sawServer != cart.id {
			t.Fatalf("server saw %s, client saw %s", sawClient, sawServer)
		}
	})

	t.Run("cart refuses the intruder", func(t *testing.T) {
		serverErr, clientErr, _, _ := handshake(t, cart, intruder, frontend.id, cart.id)
		if serverErr == nil || !strings.Contains(serverErr.Error(), intruder.id.String()) {
			t.Fatalf("server accepted or failed for another reason: %v", serverErr)
		}
		if clientErr == nil {
			t.Fatal("the intruder's connection worked")
		}
	})

	t.Run("frontend refuses an intruder posing as cart", func(t *testing.T) {
		_, clientErr, _, _ := handshake(t, intruder, frontend, frontend.id, cart.id)
		if clientErr == nil || !strings.Contains(clientErr.Error(), intruder.id.String()) {
			t.Fatalf("client accepted or failed for another reason: %v", clientErr)
		}
	})
}
