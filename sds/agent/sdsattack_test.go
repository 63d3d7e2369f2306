package agent_test

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/bench/agentflood"
	"github.com/meshid/meshid/internal/unixsock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

// dialH2 is an attacker's own HTTP/2 client on the socket at path (it
// ignores the limits the server advertises), closed at the end of the test.
func dialH2(t *testing.T, path string) *agentflood.H2 {
	t.Helper()
	c, err := agentflood.DialH2(path, testkit.Guard) // a safety bound: the server answers at once
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Issue 28, hole 3, through the agent assembly: the SDS socket has the
// Workload API socket's limits. Before the fix (gRPC's defaults) a 1 MiB
// header opened a stream (40 streams of 15 MiB took the agent to 1.98 GB),
// one connection could open any number of streams (20,000: 396 MB) and
// any number of connections were served.
func TestSDSSocketLimitsThroughAgent(t *testing.T) {
	w := newWorld(t)
	reg := prometheus.NewRegistry()
	cfg := w.config()
	cfg.SDSSocket = filepath.Join(testkit.ShortDir(t), "sds.sock")
	cfg.Registerer = reg
	a := testkit.RunAgent(t, cfg)
	firstSecret(t, a)

	t.Run("huge header", func(t *testing.T) {
		c := dialH2(t, cfg.SDSSocket)
		if got := c.Settings[http2.SettingMaxHeaderListSize]; got != unixsock.MaxHeaderListSize {
			t.Errorf("the SDS socket advertises a header list limit of %d, want %d", got, unixsock.MaxHeaderListSize)
		}
		_ = c.Open(1, agentflood.StreamSecretsPath, 1<<20)
		got, closed, _ := c.Outcomes()
		if got[1] == "" && !closed {
			t.Fatalf("a stream with 1 MiB of headers was opened")
		}
		// A gRPC client learns the limit from the server and fails the call
		// itself.
		gc := secretv3.NewSecretDiscoveryServiceClient(testkit.DialUnix(t, cfg.SDSSocket))
		if _, err := gc.FetchSecrets(t.Context(), &discoveryv3.DiscoveryRequest{ResourceNames: []string{"default"}}); err != nil {
			t.Fatal(err)
		}
		big := metadata.AppendToOutgoingContext(t.Context(), "x-pad", strings.Repeat("a", 1<<20))
		_, err := gc.FetchSecrets(big, &discoveryv3.DiscoveryRequest{ResourceNames: []string{"default"}})
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "maximum size (16384 bytes) set by server") {
			t.Fatalf("a gRPC call with 1 MiB of headers: %v, want the client's Internal naming the server's limit", err)
		}
		// The refusal is the header limit, not the raw client: the same
		// stream with a short header is opened.
		c = dialH2(t, cfg.SDSSocket)
		_ = c.Open(1, agentflood.StreamSecretsPath, 1<<10)
		if got, closed, _ := c.Outcomes(); got[1] != "" || closed {
			t.Fatalf("a stream with 1 KiB of headers: %q, connection closed %v", got[1], closed)
		}
	})

	t.Run("streams per connection", func(t *testing.T) {
		const over = 8
		c := dialH2(t, cfg.SDSSocket)
		if got := c.Settings[http2.SettingMaxConcurrentStreams]; got != unixsock.MaxConcurrentStreams {
			t.Errorf("the SDS socket advertises %d streams per connection, want %d", got, unixsock.MaxConcurrentStreams)
		}
		got, closed, _ := c.OpenMany(1, unixsock.MaxConcurrentStreams+over, agentflood.StreamSecretsPath)
		if closed {
			t.Fatal("the connection closed")
		}
		refused := 0
		for id, o := range got {
			if o != "rst "+http2.ErrCodeRefusedStream.String() {
				t.Errorf("stream %d: %s", id, o)
			}
			refused++
		}
		if refused != over {
			t.Fatalf("%d of %d streams on one connection refused, want the %d beyond %d", refused, unixsock.MaxConcurrentStreams+over, over, unixsock.MaxConcurrentStreams)
		}
	})

	t.Run("connections", func(t *testing.T) {
		conns := make([]net.Conn, 0, sdsserver.DefaultMaxConnections+1)
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		var accepted, refused int
		for range sdsserver.DefaultMaxConnections + 1 {
			c, err := net.Dial("unix", cfg.SDSSocket)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			_ = c.SetReadDeadline(time.Now().Add(testkit.Guard))
			_, _ = c.Write([]byte(http2.ClientPreface))
			var b [9]byte // a frame header: the server's SETTINGS
			switch _, err := io.ReadFull(c, b[:]); {
			case err == nil:
				accepted++
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isReset(err):
				refused++
			default:
				t.Fatal(err)
			}
		}
		if refused == 0 {
			t.Fatalf("%d connections served, none refused (cap %d)", accepted, sdsserver.DefaultMaxConnections)
		}
		if n := testkit.Metric(t, reg, "meshid_agent_sds_refused_total", "reason", "connections"); n != float64(refused) {
			t.Fatalf("refused_total{connections} = %v, want %d", n, refused)
		}
		t.Logf("%d connections served, %d refused", accepted, refused)
	})
}

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}
