package certservice

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
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
// backoff), and closes a connection on which no call has authenticated
// within the first-request timeout (which includes its TLS handshake),
// once no call runs on it (issue 28, hole 2: an unauthenticated call used
// to count as the first request, so 20 callers without a token held every
// slot of --max-connections 20 for good).
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
		"Connections to the CA's gRPC endpoint closed by a limit: limit (all connections), per_ip_limit, first_request_timeout (no call authenticated in time).",
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
// and watched until a call on it authenticates.
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

// firstRequestRecheck is how often a connection past its first-request
// timeout is looked at again while unauthenticated calls run on it (a
// first request whose token review is slow is not cut off; one that ends
// without authenticating leaves the connection to be closed here).
const firstRequestRecheck = time.Second

// trackedConn is an admitted connection.
type trackedConn struct {
	net.Conn // a connlimit connection: its Close gives the slot back
	l        *connLimiter
	key      string

	// authenticated is set once a call on the connection authenticated;
	// read without the lock on every request.
	authenticated atomic.Bool
	mu            sync.Mutex
	calls         int           // calls running that have not authenticated
	served        chan struct{} // closed when a call authenticates
	closeOnce     sync.Once
	closed        chan struct{}
}

// watch closes the connection when no call on it has authenticated by the
// time timer fires and none is running; while calls run it looks again
// every firstRequestRecheck.
func (c *trackedConn) watch(timer clock.Timer) {
	defer timer.Stop()
	for {
		select {
		case <-timer.C():
			if !c.expire() {
				return
			}
			timer.Reset(firstRequestRecheck)
		case <-c.served:
			return
		case <-c.closed:
			return
		}
	}
}

// expire is the first-request timeout. It closes the connection unless a
// call on it authenticated, and reports whether it must look again
// because unauthenticated calls are running.
func (c *trackedConn) expire() (again bool) {
	c.mu.Lock()
	authenticated, running := c.authenticated.Load(), c.calls > 0
	c.mu.Unlock()
	switch {
	case authenticated:
		return false
	case running:
		return true
	}
	select {
	case <-c.closed:
	default:
		c.l.metrics.refused[refusedFirstRequest].Inc()
		c.Close()
	}
	return false
}

func (c *trackedConn) Close() error {
	c.closeOnce.Do(func() {
		c.l.release(c)
		close(c.closed)
	})
	return c.Conn.Close()
}

func (c *trackedConn) begin() {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
}

func (c *trackedConn) end() {
	c.mu.Lock()
	c.calls--
	c.mu.Unlock()
}

func (c *trackedConn) markServed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.authenticated.Load() {
		c.authenticated.Store(true)
		close(c.served)
	}
}

// conn returns the tracked connection ctx's call arrived on, nil if none
// (a call not from this limiter's listener). The peer's address is the key
// Accept stored (the transport reads it from the same connection).
func (l *connLimiter) conn(ctx context.Context) *trackedConn {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	key := p.Addr.String()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[key]
}

// connKey is the context key under which unaryInterceptor passes a
// connection that has not authenticated yet to the call.
type connKey struct{}

// unaryInterceptor lets the call's authentication mark its connection
// served (markServed) while no call on it has authenticated, and counts
// such calls so that the first-request timeout waits for them rather than
// cut off a first request whose token review is slow. The CA's services
// are all unary; a streaming one would need a stream interceptor doing
// the same.
//
// It is an interceptor rather than a gRPC stats handler: with any stats
// handler installed, gRPC copies every request's metadata (the token
// included; 1.2% of the CA's CPU profile) and builds event values for it
// per RPC (13 of 312 allocations per certificate, docs/benchmarks.md), to
// learn one bit per connection. A connection that has authenticated costs
// one map lookup per call, as before.
func (l *connLimiter) unaryInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := l.conn(ctx)
	if c == nil || c.authenticated.Load() {
		return handler(ctx, req)
	}
	c.begin()
	defer c.end()
	return handler(context.WithValue(ctx, connKey{}, c), req)
}

// markServed tells the limiter that the call of ctx authenticated (issue
// 28, hole 2: any call used to mark its connection, so one unauthenticated
// call lifted the first-request timeout for good). Its connection is no
// longer bound by the first-request timeout, only by the idle limit.
func markServed(ctx context.Context) {
	if c, ok := ctx.Value(connKey{}).(*trackedConn); ok {
		c.markServed()
	}
}
