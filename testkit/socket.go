package testkit

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// ShortDir returns a new directory with a short path, removed when the test
// ends: a Unix socket path holds at most 107 bytes, and t.TempDir() paths
// carry the test's name.
func ShortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "meshid")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// ServeUnix serves a gRPC server, with what register adds, on a Unix socket
// in a ShortDir until the test ends, and returns the socket's path.
func ServeUnix(t testing.TB, register func(*grpc.Server)) string {
	t.Helper()
	path := filepath.Join(ShortDir(t), "s.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return path
}

// DialUnix returns a gRPC client connection, without TLS, to the Unix
// socket at path (an SDS or Workload API socket), closed when the test ends.
func DialUnix(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// WaitForSocket returns once something accepts connections on the Unix
// socket at path, failing t after Guard. A server's Run creates its socket
// on its own goroutine; this is the condition to wait for, polled.
func WaitForSocket(t testing.TB, path string) {
	t.Helper()
	deadline := time.Now().Add(Guard)
	for {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s did not come up within %v", path, Guard)
		}
		time.Sleep(time.Millisecond)
	}
}
