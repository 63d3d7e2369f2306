package connlimit_test

import (
	"net"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/connlimit"
	"github.com/meshid/meshid/testkit"
)

// harness runs Accept on a real TCP listener and reports each accepted
// connection or refusal, in order.
type harness struct {
	l        *connlimit.Listener
	accepted chan net.Conn
	refused  chan string
}

func newHarness(t *testing.T, cfg connlimit.Config) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{accepted: make(chan net.Conn, 16), refused: make(chan string, 16)}
	cfg.Refused = func(reason string) { h.refused <- reason }
	h.l = connlimit.New(ln, cfg)
	t.Cleanup(func() { h.l.Close() })
	go func() {
		for {
			c, err := h.l.Accept()
			if err != nil {
				return
			}
			h.accepted <- c
		}
	}()
	return h
}

// dial connects from the loopback address ip (any of 127.0.0.0/8 on
// Linux) and returns the server's side of the connection, or the reason it
// was refused.
func (h *harness) dial(t *testing.T, ip string) (net.Conn, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", h.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	select {
	case s := <-h.accepted:
		return s, ""
	case r := <-h.refused:
		// The refused client sees its connection closed.
		c.SetReadDeadline(time.Now().Add(testkit.Guard))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a refused connection is still open")
		}
		return nil, r
	case <-time.After(testkit.Guard):
		t.Fatal("Accept neither accepted nor refused the connection")
		return nil, ""
	}
}

// TestCaps: with a per-IP cap of 2 and a total cap of 3, a third
// connection from one IP is refused, another IP gets in until the total
// cap, and a closed connection gives its slot back once, however often it
// is closed.
func TestCaps(t *testing.T) {
	h := newHarness(t, connlimit.Config{Max: 3, PerIP: 2})
	a1, _ := h.dial(t, "127.0.0.1")
	if _, r := h.dial(t, "127.0.0.1"); r != "" {
		t.Fatalf("second connection from one IP refused: %s", r)
	}
	if _, r := h.dial(t, "127.0.0.1"); r != connlimit.ReasonPerIP {
		t.Fatalf("third connection from one IP: refused %q, want %q", r, connlimit.ReasonPerIP)
	}
	if _, r := h.dial(t, "127.0.0.2"); r != "" {
		t.Fatalf("another IP within the total cap refused: %s", r)
	}
	if _, r := h.dial(t, "127.0.0.3"); r != connlimit.ReasonTotal {
		t.Fatalf("fourth connection in all: refused %q, want %q", r, connlimit.ReasonTotal)
	}
	if n := h.l.Open(); n != 3 {
		t.Fatalf("Open = %d, want 3", n)
	}
	a1.Close()
	a1.Close()
	if n := h.l.Open(); n != 2 {
		t.Fatalf("Open after closing one connection twice = %d, want 2", n)
	}
	if _, r := h.dial(t, "127.0.0.3"); r != "" {
		t.Fatalf("connection after one closed refused: %s", r)
	}
	if _, r := h.dial(t, "127.0.0.1"); r != connlimit.ReasonTotal {
		t.Fatalf("over the total cap again: refused %q", r)
	}
}

// TestSlotFreeBeforePeerSeesClose: when a peer sees its connection closed,
// its slot is free already, so it may connect again at once from the same
// IP. The underlying connection checks Open at the moment it is closed.
func TestSlotFreeBeforePeerSeesClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	openAtClose := make(chan int, 1)
	var l *connlimit.Listener
	l = connlimit.New(probeListener{ln, func() { openAtClose <- l.Open() }}, connlimit.Config{Max: 1, PerIP: 1})
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	if n := l.Open(); n != 1 {
		t.Fatalf("Open = %d, want 1", n)
	}
	s.Close()
	if n := <-openAtClose; n != 0 {
		t.Fatalf("Open when the connection was closed = %d, want 0: the peer could see the close and be refused", n)
	}
}

// probeListener's connections call onClose when they are closed.
type probeListener struct {
	net.Listener
	onClose func()
}

func (p probeListener) Accept() (net.Conn, error) {
	c, err := p.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return probeConn{c, p.onClose}, nil
}

type probeConn struct {
	net.Conn
	onClose func()
}

func (c probeConn) Close() error { c.onClose(); return c.Conn.Close() }

// TestNoPerIPCap: PerIP 0 leaves one peer every slot of Max.
func TestNoPerIPCap(t *testing.T) {
	h := newHarness(t, connlimit.Config{Max: 2})
	for i := range 2 {
		if _, r := h.dial(t, "127.0.0.1"); r != "" {
			t.Fatalf("connection %d refused: %s", i, r)
		}
	}
	if _, r := h.dial(t, "127.0.0.1"); r != connlimit.ReasonTotal {
		t.Fatalf("over Max: refused %q", r)
	}
}

// TestZeroMax: a Max of 0 refuses every connection.
func TestZeroMax(t *testing.T) {
	h := newHarness(t, connlimit.Config{})
	if _, r := h.dial(t, "127.0.0.1"); r != connlimit.ReasonTotal {
		t.Fatalf("Max 0: refused %q", r)
	}
}

func TestPeerIP(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 5}:  "10.0.0.1",
		&net.TCPAddr{IP: net.ParseIP("::1"), Port: 5}:       "::1",
		&net.UnixAddr{Name: "@", Net: "unix"}:               "@",
		&net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 9}: "192.0.2.1",
	} {
		if got := connlimit.PeerIP(addr); got != want {
			t.Errorf("PeerIP(%v) = %q, want %q", addr, got, want)
		}
	}
}
