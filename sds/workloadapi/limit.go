package workloadapi

import (
	"net"
	"sync"
	"sync/atomic"
)

// limitListener closes, as soon as accepted, a connection beyond max open
// at once. golang.org/x/net/netutil's LimitListener would stop accepting
// instead, leaving clients queued in the kernel's backlog with no answer;
// closing at once fails them fast (Unavailable) and keeps Accept going.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused func()
}

func newLimitListener(ln net.Listener, max int, refused func()) *limitListener {
	return &limitListener{Listener: ln, max: int64(max), refused: refused}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			l.refused()
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

// countedConn gives its slot back once, on its first Close.
type countedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}
