package certservice

import (
	"net"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
)

// TestClosedConnectionsForgotten: the limiter forgets a connection when it
// closes (it keeps each open one by remote address, for the stats handler
// that marks its first request), so connections opened and closed one
// after another, as a client that reconnects in a loop, hold nothing; an
// open one is still known. Not observable through the server's API but as
// memory that grows with every connection ever made.
func TestClosedConnectionsForgotten(t *testing.T) {
	m, _ := newConnMetrics()
	l := newConnLimiter(8, 8, time.Minute, clock.NewFake(time.Now()), m)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.listener(raw)
	defer ln.Close()
	known := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.conns)
	}
	accept := func() (server, client net.Conn) {
		t.Helper()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server, err = ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return server, client
	}
	kept, keptClient := accept()
	defer keptClient.Close()
	defer kept.Close()
	for range 10 {
		s, c := accept()
		if n := known(); n != 2 {
			t.Fatalf("%d connections known with 2 open", n)
		}
		c.Close()
		s.Close()
	}
	if n := known(); n != 1 {
		t.Fatalf("%d connections known after 10 closed and 1 open, want 1", n)
	}
	l.mu.Lock()
	_, ok := l.conns[kept.(*trackedConn).key]
	l.mu.Unlock()
	if !ok {
		t.Fatal("the open connection is forgotten")
	}
}
