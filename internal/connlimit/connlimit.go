package connlimit

import (
	"net"
	"sync"
)

// Reasons a connection is refused, passed to Config.Refused.
const (
	ReasonTotal = "limit"        // Config.Max connections are open
	ReasonPerIP = "per_ip_limit" // Config.PerIP connections from its IP are open
)

// Config configures a Listener.
type Config struct {
	// Max caps the connections open at once; below 1 every connection is
	// refused. Callers validate their own limits and defaults.
	Max int
	// PerIP caps the connections open at once from one peer IP; 0 (or
	// less) means no cap but Max.
	PerIP int
	// Refused, when set, is called with the reason of each connection
	// closed by a cap. It must not block.
	Refused func(reason string)
}

// Listener is a net.Listener whose Accept returns only connections within
// the caps; an accepted connection gives its slot back on its first Close,
// before the peer can see it closed.
type Listener struct {
	net.Listener
	cfg Config

	mu    sync.Mutex
	total int
	byIP  map[string]int
}

// New wraps ln.
func New(ln net.Listener, cfg Config) *Listener {
	return &Listener{Listener: ln, cfg: cfg, byIP: map[string]int{}}
}

// Accept waits for the next connection within the caps, closing those
// beyond them.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := PeerIP(c.RemoteAddr())
		if reason, ok := l.admit(ip); !ok {
			// Refused first: once closed, the client may already look
			// at what Refused records (a metric).
			if l.cfg.Refused != nil {
				l.cfg.Refused(reason)
			}
			c.Close()
			continue
		}
		return &conn{Conn: c, l: l, ip: ip}, nil
	}
}

// Open returns the connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// admit takes a slot for a connection from ip, or says which cap is full.
func (l *Listener) admit(ip string) (reason string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total >= l.cfg.Max:
		return ReasonTotal, false
	case l.cfg.PerIP > 0 && l.byIP[ip] >= l.cfg.PerIP:
		return ReasonPerIP, false
	}
	l.total++
	l.byIP[ip]++
	return "", true
}

func (l *Listener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// PeerIP is the IP of a peer's address (the whole address when it has no
// port, as a Unix socket's).
func PeerIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// conn is an admitted connection.
type conn struct {
	net.Conn
	l    *Listener
	ip   string
	once sync.Once
}

// Close gives the slot back before it closes the connection, so that a
// peer that sees its connection closed may connect again at once: the
// other order let a test's next connection from the same IP race the
// release and be refused (ca/certservice's TestConnectionLimits flaked so).
func (c *conn) Close() error {
	c.once.Do(func() { c.l.release(c.ip) })
	return c.Conn.Close()
}
