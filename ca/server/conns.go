package server

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/connlimit"
	"github.com/meshid/meshid/internal/metric"
)

// Connection limits (issue 9, hole 10): 4,000 idle, handshaken connections
// held 200 MB of the CA. connLimiter bounds the connections open at once,
// in all and per peer IP (internal/connlimit, which closes an excess
// connection at once: the client sees Unavailable and retries with its
// backoff), and closes a connection that has not begun a request within the
// first-request timeout (which includes its TLS handshake).
type connLimiter struct {
	max, perIP   int
	firstRequest time.Duration
	clock        clock.Clock
	metrics      *connMetrics

	mu    sync.Mutex
	conns map[string]*trackedConn // by remote address, for markServed
}

type connMetrics struct {
	open    prometheus.Gauge
	refused map[string]prometheus.Counter // by reason
}

// Reasons a connection is refused or closed, the values of the reason
// label of meshid_ca_connections_refused_total.
const (
	refusedGlobal       = connlimit.ReasonTotal
	refusedPerIP        = connlimit.ReasonPerIP
	refusedFirstRequest = "first_request_timeout"
)

func newConnMetrics() (*connMetrics, []prometheus.Collector) {
	open := metric.Gauge("meshid_ca_connections_open",
		"Connections to the CA's gRPC endpoint open now.")
	refused := metric.CounterVec("meshid_ca_connections_refused_total",
		"Connections to the CA's gRPC endpoint closed by a limit: limit (all connections), per_ip_limit, first_request_timeout.",
		"reason")
	m := &connMetrics{open: open, refused: map[string]prometheus.Counter{}}
	for _, r := range []string{refusedGlobal, refusedPerIP, refusedFirstRequest} {
		m.refused[r] = refused.WithLabelValues(r)
	}
	return m, []prometheus.Collector{open, refused}
}

func newConnLimiter(max, perIP int, firstRequest time.Duration, clk clock.Clock, m *connMetrics) *connLimiter {
	return &connLimiter{max: max, perIP: perIP, firstRequest: firstRequest, clock: clk, metrics: m, conns: map[string]*trackedConn{}}
}

func (l *connLimiter) release(c *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[c.key] == c {
		delete(l.conns, c.key)
	}
	l.metrics.open.Dec()
}

// listener wraps ln so that every accepted connection is within the caps
// and watched until its first request.
func (l *connLimiter) listener(ln net.Listener) net.Listener {
	return &limitListener{
		Listener: connlimit.New(ln, connlimit.Config{
			Max:     l.max,
			PerIP:   l.perIP,
			Refused: func(reason string) { l.metrics.refused[reason].Inc() },
		}),
		l: l,
	}
}

type limitListener struct {
	net.Listener
	l *connLimiter
}

func (ll *limitListener) Accept() (net.Conn, error) {
	c, err := ll.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: ll.l, key: c.RemoteAddr().String(), served: make(chan struct{}), closed: make(chan struct{})}
	ll.l.mu.Lock()
	ll.l.conns[tc.key] = tc
	ll.l.mu.Unlock()
	ll.l.metrics.open.Inc()
	timer := ll.l.clock.NewTimer(ll.l.firstRequest)
	go tc.watch(timer)
	return tc, nil
}

// trackedConn is an admitted connection.
type trackedConn struct {
	net.Conn // a connlimit connection: its Close gives the slot back
	l        *connLimiter
	key      string

	serveOnce sync.Once
	served    chan struct{} // closed at its first request
	closeOnce sync.Once
	closed    chan struct{}
}

// watch closes the connection when timer fires before its first request.
func (c *trackedConn) watch(timer clock.Timer) {
	defer timer.Stop()
	select {
	case <-timer.C():
		select {
		case <-c.served:
		case <-c.closed:
		default:
			c.l.metrics.refused[refusedFirstRequest].Inc()
			c.Close()
		}
	case <-c.served:
	case <-c.closed:
	}
}

func (c *trackedConn) Close() error {
	c.closeOnce.Do(func() {
		c.l.release(c)
		close(c.closed)
	})
	return c.Conn.Close()
}

func (c *trackedConn) markServed() { c.serveOnce.Do(func() { close(c.served) }) }

// markServed tells the limiter that the caller's connection has begun a
// request, so its first-request timer no longer applies. It is called from
// a unary interceptor rather than a gRPC stats handler: with any stats
// handler installed, gRPC copies every request's metadata (the token
// included; 1.2% of the CA's CPU profile) and builds event values for it
// per RPC (13 of 312 allocations per certificate, docs/benchmarks.md), to
// learn one bit per connection. The peer's address is the key Accept stored (the transport
// reads it from the same connection).
func (l *connLimiter) markServed(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return
	}
	key := p.Addr.String()
	l.mu.Lock()
	c := l.conns[key]
	l.mu.Unlock()
	if c != nil {
		c.markServed()
	}
}

// unaryInterceptor marks the connection served. The CA's services are all
// unary; a streaming one would need a stream interceptor doing the same.
func (l *connLimiter) unaryInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	l.markServed(ctx)
	return handler(ctx, req)
}
