// Command workload is the node suite's workload: in a pod beside meshid's
// agent sidecar it fetches its certificate over SDS (the agent's socket,
// as Envoy does) and over the SPIFFE Workload API (go-spiffe), prints both
// identities, and then either serves mTLS with the Workload API's SVID
// (`workload serve ADDR`) or dials such a server again and again
// (`workload dial ADDR SERVER-ID`), counting handshakes. Output is one line
// per event, read by the test from the pod's log:
//
//	sds spiffe://... roots=N at=UNIXNANO (when the SVID arrived)
//	workloadapi spiffe://...
//	peer spiffe://...            (serve: a client's identity)
//	handshake ok peer=spiffe://... (dial: the first, then every 100th)
//	handshake failed: ...        (dial: every failure)
//	handshakes ok=N failed=M     (dial: every second)
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshid/meshid/sds/sdsfetch"
)

const (
	sdsSocket      = "/var/run/secrets/workload-spiffe-uds/socket"
	workloadSocket = "unix:///var/run/secrets/workload-spiffe-uds/workload.sock"
)

func main() {
	if len(os.Args) < 3 || (os.Args[1] == "dial" && len(os.Args) < 4) {
		fmt.Fprintln(os.Stderr, "usage: workload serve ADDR | workload dial ADDR SERVER-ID")
		os.Exit(2)
	}
	ctx := context.Background()
	secrets, err := sdsfetch.Fetch(ctx, sdsfetch.Config{Socket: sdsSocket, NodeID: "workload"})
	if err != nil {
		fail("sds", err)
	}
	fmt.Printf("sds %s roots=%d at=%d\n", leafID(secrets[0]), len(secrets[1].Roots), time.Now().UnixNano())
	source, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr(workloadSocket)))
	if err != nil {
		fail("workloadapi", err)
	}
	svid, err := source.GetX509SVID()
	if err != nil {
		fail("workloadapi", err)
	}
	fmt.Printf("workloadapi %s\n", svid.ID)
	switch os.Args[1] {
	case "serve":
		serve(source, svid.ID.TrustDomain(), os.Args[2])
	case "dial":
		id, err := spiffeid.FromString(os.Args[3])
		if err != nil {
			fail("server id", err)
		}
		dial(source, id, os.Args[2])
	}
}

func leafID(s *sdsfetch.Secret) string {
	if len(s.Chain) == 0 || len(s.Chain[0].URIs) == 0 {
		return "none"
	}
	return s.Chain[0].URIs[0].String()
}

func fail(what string, err error) {
	fmt.Printf("%s failed: %v\n", what, err)
	os.Exit(1)
}

// serve accepts mTLS from any workload of the trust domain and tells each
// client who it is; every client identity is printed once.
func serve(source *workloadapi.X509Source, td spiffeid.TrustDomain, addr string) {
	l, err := tls.Listen("tcp", addr, tlsconfig.MTLSServerConfig(source, source, tlsconfig.AuthorizeMemberOf(td)))
	if err != nil {
		fail("listen", err)
	}
	seen := map[string]bool{}
	peers := make(chan string, 16)
	go func() {
		for p := range peers {
			if !seen[p] {
				seen[p] = true
				fmt.Printf("peer %s\n", p)
			}
		}
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			continue
		}
		go func(conn *tls.Conn) {
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if err := conn.Handshake(); err != nil {
				return
			}
			id, err := spiffeIDOf(conn)
			if err != nil {
				return
			}
			select {
			case peers <- id:
			default:
			}
			fmt.Fprintf(conn, "hello %s\n", id)
		}(conn.(*tls.Conn))
	}
}

func spiffeIDOf(conn *tls.Conn) (string, error) {
	st := conn.ConnectionState()
	if len(st.PeerCertificates) == 0 || len(st.PeerCertificates[0].URIs) == 0 {
		return "", fmt.Errorf("no peer SPIFFE ID")
	}
	return st.PeerCertificates[0].URIs[0].String(), nil
}

// dial completes an mTLS handshake with the server every 50 ms, verifying
// that it is server, and reads its greeting.
func dial(source *workloadapi.X509Source, server spiffeid.ID, addr string) {
	cfg := tlsconfig.MTLSClientConfig(source, source, tlsconfig.AuthorizeID(server))
	var ok, failed atomic.Int64
	go func() {
		for range time.Tick(time.Second) {
			fmt.Printf("handshakes ok=%d failed=%d\n", ok.Load(), failed.Load())
		}
	}()
	for range time.Tick(50 * time.Millisecond) {
		if err := once(cfg, addr); err != nil {
			failed.Add(1)
			fmt.Printf("handshake failed: %v\n", err)
			continue
		}
		if n := ok.Add(1); n == 1 || n%100 == 0 {
			fmt.Printf("handshake ok peer=%s n=%d\n", server, n)
		}
	}
}

// once connects (TCP, 3 s) and then completes the TLS handshake and
// reads the greeting (3 s more): a failure says which step failed, and
// after how long.
func once(cfg *tls.Config, addr string) error {
	start := time.Now()
	raw, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return fmt.Errorf("connect after %s: %w", time.Since(start).Round(time.Millisecond), err)
	}
	connected := time.Since(start)
	conn := tls.Client(raw, cfg)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if err := conn.Handshake(); err != nil {
		return fmt.Errorf("tls handshake after %s (connected in %s from %s): %w", time.Since(start).Round(time.Millisecond), connected.Round(time.Millisecond), raw.LocalAddr(), err)
	}
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !strings.HasPrefix(string(buf[:n]), "hello spiffe://") {
		return fmt.Errorf("greeting %q", buf[:n])
	}
	return nil
}
