package unixsock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/unixsock"
	"github.com/meshid/meshid/testkit"
)

// stuck serves until its listener closes; its Stop closes the listener and
// then blocks until release closes (a handler that does not return).
type stuck struct {
	ln      chan net.Listener
	release chan struct{}
}

func (s *stuck) Serve(ln net.Listener) error {
	s.ln <- ln
	for {
		if _, err := ln.Accept(); err != nil {
			return err
		}
	}
}

func (s *stuck) Stop() {
	(<-s.ln).Close()
	<-s.release
}

// A Server whose Stop does not return within the shutdown timeout (on the
// injected clock) makes Run return an error naming its owner, and still
// removes its socket; a second Run is refused.
func TestServerBoundedStop(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	sv := &stuck{ln: make(chan net.Listener, 1), release: make(chan struct{})}
	defer close(sv.release)
	path := filepath.Join(testkit.ShortDir(t), "s.sock")
	srv := unixsock.NewServer(unixsock.ServerConfig{
		Name: "owner", Label: "Owner", Path: path, Mode: 0o600, Serve: sv,
		MaxConnections:  1,
		ShutdownTimeout: time.Second, Clock: clk,
	})
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Ready():
	default:
		t.Fatal("not ready after Listen")
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v", fi, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := testkit.Go(func() (struct{}, error) { return struct{}{}, srv.Run(ctx) })
	cancel()
	testkit.WaitForTimers(t, clk, 1, "Run's shutdown timer")
	clk.Add(time.Second)
	r := <-done
	if r.Err == nil || !strings.HasPrefix(r.Err.Error(), "owner: shutdown took longer than 1s") {
		t.Fatalf("Run = %v, want the shutdown timeout", r.Err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
	if err := srv.Run(context.Background()); err == nil || err.Error() != "owner: Run called twice" {
		t.Fatalf("second Run = %v", err)
	}
}

func TestCheckPath(t *testing.T) {
	if err := unixsock.CheckPath(strings.Repeat("x", unixsock.MaxPath)); err != nil {
		t.Fatal(err)
	}
	if err := unixsock.CheckPath(strings.Repeat("x", unixsock.MaxPath+1)); err == nil {
		t.Fatal("a path over MaxPath accepted")
	}
}

// CheckSocket: a path is required and bounded, no mode means 0600, and a
// mode letting others connect is refused.
func TestCheckSocket(t *testing.T) {
	if mode, err := unixsock.CheckSocket("/run/a.sock", 0); err != nil || mode != unixsock.DefaultMode {
		t.Fatalf("default: %#o %v", mode, err)
	}
	if mode, err := unixsock.CheckSocket("/run/a.sock", 0o660); err != nil || mode != 0o660 {
		t.Fatalf("0660: %#o %v", mode, err)
	}
	for _, tc := range []struct {
		path string
		mode os.FileMode
		want string
	}{
		{"", 0, "Config.SocketPath is required"},
		{strings.Repeat("x", unixsock.MaxPath+1), 0, "longer than"},
		{"/run/a.sock", 0o666, "no access for others"},
		{"/run/a.sock", 0o400, "owner read-write"},
	} {
		if _, err := unixsock.CheckSocket(tc.path, tc.mode); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.20q %#o: %v, want %q", tc.path, tc.mode, err, tc.want)
		}
	}
}
