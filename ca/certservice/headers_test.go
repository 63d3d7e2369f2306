package certservice_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// countingAuth counts the requests that reached authentication, then
// hands them to next.
type countingAuth struct {
	calls atomic.Int32
	next  authn.Authenticator
}

func (c *countingAuth) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	c.calls.Add(1)
	return c.next.Authenticate(ctx, creds)
}

// TestOversizedTokenRefusedBeforeAuthentication (issue 9, hole 7): a
// token over 16 KiB, inside the header limit, is Unauthenticated before
// any authenticator hashes or reviews it. On b96f7b0 it reached the
// authenticators.
func TestOversizedTokenRefusedBeforeAuthentication(t *testing.T) {
	count := &countingAuth{}
	e := newEnv(t, envOpts{auths: func(e *env) []authn.Authenticator {
		count.next = e.srvAuth(t)
		return []authn.Authenticator{count}
	}})
	c := e.client(t, "localhost", nil)
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	_, err := c.CreateCertificate(withToken(context.Background(), strings.Repeat("a", authn.MaxTokenSize+1)), &securityv1alpha1.IstioCertificateRequest{Csr: csr})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "16 KiB") {
		t.Fatalf("17 KiB token: %v, want Unauthenticated naming the 16 KiB limit", err)
	}
	if n := count.calls.Load(); n != 0 {
		t.Fatalf("the oversized token reached the authenticator %d times", n)
	}
	// A token at the limit is judged as usual.
	if _, err := c.CreateCertificate(withToken(context.Background(), e.token(t, "shop", "cart")), &securityv1alpha1.IstioCertificateRequest{Csr: csr}); err != nil {
		t.Fatalf("valid token: %v", err)
	}
}

// TestHugeHeadersRefused (issue 9, hole 7) sends, as an attacker's own
// HTTP/2 client would (a gRPC client honours the server's advertised limit
// and would not even send it), a complete CreateCertificate request whose
// authorization header is 1 MiB. The server refuses the headers: the
// request never reaches authentication. On b96f7b0 (gRPC's 16 MiB default)
// it was authenticated, and 16 such clients with 8 MB headers held
// hundreds of MB.
func TestHugeHeadersRefused(t *testing.T) {
	count := &countingAuth{}
	e := newEnv(t, envOpts{auths: func(e *env) []authn.Authenticator {
		count.next = e.srvAuth(t)
		return []authn.Authenticator{count}
	}})
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)

	outcome := rawRequest(t, e, "Bearer "+strings.Repeat("a", 1<<20), csr)
	if outcome == "grpc-status 16" || outcome == "grpc-status 0" {
		t.Fatalf("the 1 MiB header was answered as a request (%s)", outcome)
	}
	if n := count.calls.Load(); n != 0 {
		t.Fatalf("the 1 MiB header reached the authenticator %d times (outcome %s)", n, outcome)
	}
	t.Logf("1 MiB header: %s", outcome)
	// The same raw client with a small header is answered: the refusal
	// above is the header limit, not the raw client.
	if got := rawRequest(t, e, "Bearer "+e.token(t, "shop", "cart"), csr); got != "grpc-status 0" {
		t.Fatalf("raw request with a valid token: %s, want grpc-status 0", got)
	}
}

// rawRequest sends one CreateCertificate request over a hand-written
// HTTP/2 connection, ignoring the server's SETTINGS, and returns how it
// ended: "grpc-status N", "rst <code>", "goaway <code>" or "closed".
func rawRequest(t *testing.T, e *env, authorization, csr string) string {
	t.Helper()
	return rawExchange(t, e, authorization, csr).outcome
}

// rawResult is what the server sent on rawExchange's connection.
type rawResult struct {
	outcome string // as rawRequest returns it
	pings   int    // PING frames the server sent (not acks)
}

func rawExchange(t *testing.T, e *env, authorization, csr string) (res rawResult) {
	t.Helper()
	conn, err := tls.Dial("tcp", e.addr, &tls.Config{RootCAs: e.pool(), ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A safety bound only: the server answers at once.
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "https"}, {":authority", "localhost"},
		{":path", "/istio.v1.auth.IstioCertificateService/CreateCertificate"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
		{"authorization", authorization},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	block := hb.Bytes()
	const chunk = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
	first := block[:min(chunk, len(block))]
	block = block[len(first):]
	writeErr := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(block) == 0})
	for writeErr == nil && len(block) > 0 {
		next := block[:min(chunk, len(block))]
		block = block[len(next):]
		writeErr = fr.WriteContinuation(1, len(block) == 0, next)
	}
	if writeErr == nil {
		msg, err := proto.Marshal(&securityv1alpha1.IstioCertificateRequest{Csr: csr})
		if err != nil {
			t.Fatal(err)
		}
		frame := make([]byte, 5, 5+len(msg))
		binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
		writeErr = fr.WriteData(1, true, append(frame, msg...))
	}
	// A server that refused the headers may close the connection before
	// the rest of the request is written; what it sent still tells the
	// outcome, so a write error is not a failure.
	_ = writeErr
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			res.outcome = "closed"
			return res
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				res.outcome = "http " + v
				return res
			}
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					res.outcome = "grpc-status " + hf.Value
					return res
				}
			}
		case *http2.RSTStreamFrame:
			res.outcome = "rst " + f.ErrCode.String()
			return res
		case *http2.GoAwayFrame:
			res.outcome = "goaway " + f.ErrCode.String()
			return res
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				res.pings++
				_ = fr.WritePing(true, f.Data)
			}
		}
	}
}

// TestNoFlowControlPings: the CA's flow-control windows are static, so a
// request's DATA does not make the server probe the connection with a
// PING (gRPC's bandwidth-delay estimator, on by default, sends one per
// sample while data arrives and may grow a connection's window to 16 MiB).
// Requests are at most MaxRecvMsgSize; the estimator's frames cost the CA
// CPU per certificate and let a client steer how much the server buffers.
func TestNoFlowControlPings(t *testing.T) {
	e := newEnv(t, envOpts{})
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	res := rawExchange(t, e, "Bearer "+e.token(t, "shop", "cart"), csr)
	if res.outcome != "grpc-status 0" {
		t.Fatalf("raw request with a valid token: %s, want grpc-status 0", res.outcome)
	}
	if res.pings != 0 {
		t.Fatalf("the server sent %d PING frames for one request, want 0 (static windows)", res.pings)
	}
}

// TestRequestsLargerThanTheWindow: with static windows, a request larger
// than FlowControlWindow still arrives whole (the window reopens as the
// server reads): a 200 KiB CSR is judged by the CSR size limit
// (InvalidArgument naming it), and a message over MaxRecvMsgSize is
// refused by gRPC's (ResourceExhausted), neither stalling.
func TestRequestsLargerThanTheWindow(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.client(t, "localhost", nil)
	ctx := withToken(context.Background(), e.token(t, "shop", "cart"))
	big := strings.Repeat("a", 200<<10)
	if 200<<10 <= certservice.FlowControlWindow || 200<<10 >= certservice.MaxRecvMsgSize {
		t.Fatalf("the test's 200 KiB must lie between the window (%d) and the message limit (%d)", certservice.FlowControlWindow, certservice.MaxRecvMsgSize)
	}
	_, err := c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: big})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "KiB limit") {
		t.Fatalf("200 KiB CSR: %v, want InvalidArgument naming the CSR limit", err)
	}
	_, err = c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: big + strings.Repeat("a", certservice.MaxRecvMsgSize)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CSR over the message limit: %v, want ResourceExhausted", err)
	}
	// The connection is still usable.
	csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
	if _, err := c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr}); err != nil {
		t.Fatalf("after the large requests: %v", err)
	}
}
