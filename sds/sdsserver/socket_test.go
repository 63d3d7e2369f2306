package sdsserver_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

func TestSocketModes(t *testing.T) {
	tests := []struct {
		name     string
		mode     os.FileMode
		wantSock os.FileMode
		wantDir  os.FileMode
	}{
		{"default", 0, 0o600, 0o700},
		{"owner only", 0o600, 0o600, 0o700},
		{"group", 0o660, 0o660, 0o750},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(testkit.ShortDir(t), "a", "b", "sds.sock")
			srv, err := sdsserver.New(sdsserver.Config{Source: newFakeSource(), SocketPath: path, SocketMode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Listen(); err != nil {
				t.Fatal(err)
			}
			<-srv.Ready()
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != tc.wantSock {
				t.Errorf("socket mode %v, want socket %#o", fi.Mode(), tc.wantSock)
			}
			di, err := os.Stat(filepath.Dir(path))
			if err != nil {
				t.Fatal(err)
			}
			if di.Mode().Perm() != tc.wantDir {
				t.Errorf("directory mode %#o, want %#o", di.Mode().Perm(), tc.wantDir)
			}
			// Run serves on the socket, and removes it when done.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx) }()
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("socket left behind after Run: %v", err)
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*")); len(left) != 0 {
				t.Errorf("temporary files left behind: %v", left)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	src := newFakeSource()
	tests := []struct {
		name string
		cfg  sdsserver.Config
	}{
		{"no source", sdsserver.Config{SocketPath: "/tmp/x.sock"}},
		{"no path", sdsserver.Config{Source: src}},
		{"path too long", sdsserver.Config{Source: src, SocketPath: "/tmp/" + strings.Repeat("x", 120)}},
		{"world accessible", sdsserver.Config{Source: src, SocketPath: "/tmp/x.sock", SocketMode: 0o666}},
		{"owner cannot write", sdsserver.Config{Source: src, SocketPath: "/tmp/x.sock", SocketMode: 0o400}},
		{"not a permission", sdsserver.Config{Source: src, SocketPath: "/tmp/x.sock", SocketMode: os.ModeSetuid | 0o600}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := sdsserver.New(tc.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestStaleSocketIsReplaced(t *testing.T) {
	path := filepath.Join(testkit.ShortDir(t), "sds.sock")
	// A socket file nobody listens on, as a crashed agent leaves it.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
	e := fakeEnv(t)
	srv, err := sdsserver.New(sdsserver.Config{Source: e.src, SocketPath: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	testkit.Run(t, "sds server", srv.Run)
	c := newSotw(t, secretv3.NewSecretDiscoveryServiceClient(dial(t, path)), nil)
	c.request(dflt)
	if s := c.recvSecret(); s.GetName() != dflt {
		t.Fatalf("got %q", s.GetName())
	}
}

func TestRefusesWhenAnAgentIsLive(t *testing.T) {
	e := fakeEnv(t)
	h := start(t, e.src)
	second, err := sdsserver.New(sdsserver.Config{Source: e.src, SocketPath: h.path})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Listen(); err == nil || !strings.Contains(err.Error(), "another agent is serving") {
		t.Fatalf("Listen = %v, want a refusal", err)
	}
	if err := second.Run(context.Background()); err == nil {
		t.Fatal("Run started on a live agent's socket")
	}
	// The live agent still serves on its socket.
	c := newSotw(t, h.client, nil)
	c.request(dflt)
	if s := c.recvSecret(); s.GetName() != dflt {
		t.Fatalf("got %q", s.GetName())
	}
}

func TestRefusesToReplaceOtherFiles(t *testing.T) {
	path := filepath.Join(testkit.ShortDir(t), "sds.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := sdsserver.New(sdsserver.Config{Source: newFakeSource(), SocketPath: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen = %v, want a refusal", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Fatalf("the file was touched: %q %v", b, err)
	}
}
