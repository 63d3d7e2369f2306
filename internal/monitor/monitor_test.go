package monitor_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/testkit"
)

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "meshid_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var ready atomic.Bool
	s, err := monitor.New(monitor.Config{
		Listen:   "127.0.0.1:0",
		Gatherer: reg,
		Ready: func() error {
			if !ready.Load() {
				return errors.New("no certificate yet")
			}
			return nil
		},
		Handlers: map[string]http.Handler{"/extra": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "extra")
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "monitor", s.Run)
	base := "http://" + s.Addr().String()
	get := func(path string) (int, string) { return testkit.HTTP(t, http.MethodGet, base+path) }
	tests := []struct {
		path     string
		wantCode int
		wantBody string
	}{
		{"/healthz", 200, "ok"},
		{"/readyz", 503, "no certificate yet"},
		{"/metrics", 200, "meshid_test_total 3"},
		{"/extra", 200, "extra"},
		{"/nope", 404, ""},
	}
	for _, tc := range tests {
		code, body := get(tc.path)
		if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("GET %s = %d %q, want %d containing %q", tc.path, code, body, tc.wantCode, tc.wantBody)
		}
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("GET /readyz after ready = %d, want 200", code)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := monitor.New(monitor.Config{Gatherer: prometheus.NewRegistry()}); err == nil {
		t.Error("New without Listen succeeded")
	}
	if _, err := monitor.New(monitor.Config{Listen: "127.0.0.1:0"}); err == nil {
		t.Error("New without Gatherer succeeded")
	}
}

// Debug endpoints (a forced rotation, profiles) have no authentication:
// New serves them only on a loopback address (security review, hole 6).
func TestDebugEndpointsLoopbackOnly(t *testing.T) {
	h := map[string]http.Handler{"/debug/rotate": http.NotFoundHandler()}
	for listen, ok := range map[string]bool{
		"127.0.0.1:0": true, "127.0.0.2:15020": true, "[::1]:0": true, "localhost:0": true,
		"0.0.0.0:15020": false, ":15020": false, "[::]:0": false, "10.0.0.1:15020": false, "example.com:80": false, "garbage": false,
	} {
		_, err := monitor.New(monitor.Config{Listen: listen, Gatherer: prometheus.NewRegistry(), Handlers: h})
		if (err == nil) != ok {
			t.Errorf("debug endpoints on %q: %v, want allowed=%v", listen, err, ok)
		}
		if monitor.Loopback(listen) != ok {
			t.Errorf("Loopback(%q) = %v", listen, !ok)
		}
	}
	// Without /debug/ paths any address is fine.
	if _, err := monitor.New(monitor.Config{Listen: "0.0.0.0:0", Gatherer: prometheus.NewRegistry(), Handlers: map[string]http.Handler{"/other": http.NotFoundHandler()}}); err != nil {
		t.Fatal(err)
	}
}

// registererOnly is a Registerer that is not a Gatherer.
type registererOnly struct{ prometheus.Registerer }

func TestRegistryDefaults(t *testing.T) {
	reg, g, ok := monitor.Registry(nil, nil)
	if !ok || reg == nil || g == nil || reg.(*prometheus.Registry) != g.(*prometheus.Registry) {
		t.Fatalf("Registry(nil, nil) = %v, %v, %v; want one new registry as both", reg, g, ok)
	}
	given := prometheus.NewRegistry()
	if reg, g, ok := monitor.Registry(given, nil); !ok || reg != given || g != given {
		t.Fatalf("Registry(reg, nil) = %v, %v, %v; want reg as both", reg, g, ok)
	}
	other := prometheus.NewRegistry()
	if reg, g, ok := monitor.Registry(nil, other); !ok || g != other || reg == prometheus.Registerer(other) {
		t.Fatalf("Registry(nil, g) = %v, %v, %v; want a new Registerer and g kept", reg, g, ok)
	}
	if _, g, ok := monitor.Registry(registererOnly{given}, nil); ok || g != nil {
		t.Fatalf("Registry(non-Gatherer, nil) = %v, %v; want no Gatherer", g, ok)
	}
}

func TestNilServerHasNoAddr(t *testing.T) {
	var s *monitor.Server
	if a := s.Addr(); a != nil {
		t.Fatalf("nil Server Addr = %v, want nil", a)
	}
}

// TestLocalHandlersLoopbackPeerOnly: a local handler is served on a
// listener on every interface, but only to loopback peers; a peer on
// another address (a real connection through the host's own non-loopback
// address when it has one) gets 403 and never reaches the handler.
func TestLocalHandlersLoopbackPeerOnly(t *testing.T) {
	var calls atomic.Int32
	s, err := monitor.New(monitor.Config{
		Listen:   "0.0.0.0:0",
		Gatherer: prometheus.NewRegistry(),
		LocalHandlers: map[string]http.Handler{"/debug/secrets": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			io.WriteString(w, "public")
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "monitor", s.Run)
	_, port, _ := net.SplitHostPort(s.Addr().String())
	get := func(host string) int {
		t.Helper()
		resp, err := http.Get("http://" + net.JoinHostPort(host, port) + "/debug/secrets")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("127.0.0.1"); code != 200 || calls.Load() != 1 {
		t.Fatalf("loopback peer: %d, %d calls", code, calls.Load())
	}
	if ip := testkit.NonLoopbackIP(); ip != "" {
		if code := get(ip); code != http.StatusForbidden {
			t.Fatalf("peer %s: %d, want 403", ip, code)
		}
	}
	for _, peer := range []string{"10.1.2.3:4000", "[fe80::1]:4000", "garbage"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/debug/secrets", nil)
		req.RemoteAddr = peer
		monitor.LoopbackPeerOnly(http.NotFoundHandler()).ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden {
			t.Errorf("peer %s: %d", peer, rec.Code)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler called %d times", calls.Load())
	}
}

// TestListenTakenNamesTheFlag: a port another process holds (a second
// agent on the default port) is an error that names --monitoring-listen and
// says how to pick a free one.
func TestListenTakenNamesTheFlag(t *testing.T) {
	first, err := monitor.New(monitor.Config{Listen: "127.0.0.1:0", Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "monitor", first.Run)
	second, err := monitor.New(monitor.Config{Listen: first.Addr().String(), Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	err = second.Listen()
	if err == nil || !strings.Contains(err.Error(), "--monitoring-listen "+first.Addr().String()) || !strings.Contains(err.Error(), "127.0.0.1:0 picks one") {
		t.Fatalf("second listener on %s: %v", first.Addr(), err)
	}
}
