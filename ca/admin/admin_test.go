package admin_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

func selfSigned(t *testing.T, cn string) *keystore.Bundle {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	c, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: cn}, Key: key, NotBefore: time.Now().Add(-time.Hour), TTL: 24 * time.Hour, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	return &keystore.Bundle{Cert: c, Key: key, Roots: []*x509.Certificate{c}}
}

// serve runs an admin server on a real rotation of a real authority, in
// dir, and returns the rotation and the socket.
func serve(t *testing.T, dir string, maxConns int) (*rotation.Manager, string) {
	t.Helper()
	b := selfSigned(t, "first")
	auth, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"), Bundle: b, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rot, err := rotation.New(rotation.Config{Current: b, Target: auth, Check: auth.Check})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "admin.sock")
	srv, err := admin.New(admin.Config{Socket: sock, Rotation: func() *rotation.Manager { return rot }, MaxConnections: maxConns})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "admin", srv.Run)
	testkit.WaitForSocket(t, sock)
	return rot, sock
}

func TestActivateOverSocket(t *testing.T) {
	rot, sock := serve(t, testkit.ShortDir(t), 0)
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", st.Mode(), err)
	}
	c := admin.NewClient(sock, 10*time.Second)
	ctx := context.Background()
	if _, err := c.Activate(ctx); err == nil || !strings.Contains(err.Error(), "no CA is prepared") {
		t.Fatalf("activate with nothing prepared: %v", err)
	}
	if _, err := c.RotateRoot(ctx); err == nil || !strings.Contains(err.Error(), "plugged in") {
		t.Fatalf("rotate-root of a CA without NewRoot: %v", err)
	}
	if err := rot.SetBundle(selfSigned(t, "second")); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != "prepared" || st.Prepared == nil || st.Prepared.Subject != "CN=second" || len(st.Roots) != 2 || st.NextStep != "activate" || st.ActivateAt == nil {
		t.Fatalf("status: %+v", st)
	}
	if st.Since == nil || st.ActivateAt.Sub(*st.Since) != rotation.DefaultPropagation {
		t.Fatalf("prepared since %v, activates %v: want the propagation between", st.Since, st.ActivateAt)
	}
	var text strings.Builder
	st.Format(&text, *st.Since)
	if !strings.Contains(text.String(), "phase:     prepared  since ") {
		t.Fatalf("text status:\n%s", text.String())
	}
	st, err = c.Activate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != "active" || st.Signing.Subject != "CN=second" || st.Roots[1].State != "retiring" || st.Roots[1].RetireAt == nil {
		t.Fatalf("after activate: %+v", st)
	}
}

// Another user cannot connect: the socket is 0600, even in a directory
// everyone can enter.
func TestOtherUserCannotConnect(t *testing.T) {
	if os.Getuid() != 0 {
		testkit.SkipOrFail(t, "needs root to act as another user (setfsuid)")
	}
	dir := testkit.ShortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, sock := serve(t, dir, 0)
	dial := func(uid int) error {
		errc := make(chan error, 1)
		go func() {
			// setfsuid changes this thread's file-system identity only and
			// drops root's file capabilities with it; the thread is never
			// given back to the scheduler (it exits with the goroutine).
			runtime.LockOSThread()
			syscall.Syscall(syscall.SYS_SETFSUID, uintptr(uid), 0, 0)
			c, err := net.Dial("unix", sock)
			if err == nil {
				c.Close()
			}
			errc <- err
		}()
		return <-errc
	}
	if err := dial(65534); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("uid 65534 connecting: %v, want EACCES", err)
	}
	if err := dial(0); err != nil {
		t.Fatalf("the owner cannot connect: %v", err)
	}
}

// Huge headers and bodies, wrong methods and unknown paths are refused
// without touching the rotation; 10,000 repeated activations change
// nothing.
func TestAttacks(t *testing.T) {
	rot, sock := serve(t, testkit.ShortDir(t), 0)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	do := func(method, path string, body []byte, header string) int {
		t.Helper()
		req, err := http.NewRequest(method, "http://x"+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			req.Header.Set("X-Big", header)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := do(http.MethodPost, "/v1/activate", nil, strings.Repeat("a", 1<<20)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("1 MiB header: %d", code)
	}
	if code := do(http.MethodPost, "/v1/activate", bytes.Repeat([]byte("a"), 1<<20), ""); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("1 MiB body: %d", code)
	}
	if code := do(http.MethodGet, "/v1/activate", nil, ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET activate: %d", code)
	}
	if code := do(http.MethodPost, "/v1/status", nil, ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST status: %d", code)
	}
	if code := do(http.MethodGet, "/../../etc/passwd", nil, ""); code != http.StatusNotFound && code != http.StatusMovedPermanently {
		t.Fatalf("path outside: %d", code)
	}
	for i := range 10000 {
		if code := do(http.MethodPost, "/v1/activate", nil, ""); code != http.StatusConflict {
			t.Fatalf("activation %d: %d, want 409", i, code)
		}
	}
	if st := rot.Status(); st.Phase != rotation.Stable || len(st.Steps) != 0 {
		t.Fatalf("after the attacks: %v, steps %v", st.Phase, st.Steps)
	}
}

// At most MaxConnections are open at once: one more waits until one
// closes.
func TestConnectionLimit(t *testing.T) {
	_, sock := serve(t, testkit.ShortDir(t), 2)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// serve's own probe connection may still count for a moment; the
	// held ones do until closed.
	if _, err := admin.NewClient(sock, 200*time.Millisecond).Status(context.Background()); err == nil {
		t.Fatal("a third connection was served while two were held")
	}
	held[0].Close()
	if _, err := admin.NewClient(sock, 10*time.Second).Status(context.Background()); err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	held[1].Close()
}
