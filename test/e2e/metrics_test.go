package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/metricsref"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// recorder is a registry that records the name of every metric registered
// with it, served or not yet (a vector without series is not gathered).
type recorder struct {
	*prometheus.Registry
	mu    sync.Mutex
	names map[string]bool
}

func newRecorder() *recorder {
	return &recorder{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	r.mu.Lock()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	r.mu.Unlock()
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Every metric a running CA and agent register is in the generated
// reference (docs/reference/metrics.md), and their /metrics, deprecated
// names included, pass promlint.
func TestMetricsReference(t *testing.T) {
	ref, err := os.ReadFile(filepath.Join("..", "..", metricsref.File))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, false)
	caReg, agentReg := newRecorder(), newRecorder()
	ca := testkit.CA(t, caserver.Config{
		TrustDomain: td,
		StateDir:    w.caDir,
		Authn: caserver.AuthnConfig{
			JWTIssuer: w.issuer.Issuer(),
			JWKSFile:  filepath.Join(w.dir, devissuer.JWKSFile),
		},
		Monitoring: caserver.MonitoringConfig{
			Listen: "127.0.0.1:0",
		},
		Registerer: caReg,
		Gatherer:   caReg,
		Logger:     discard,
	})
	tok, err := w.issuer.Mint("default", "default", []string{"istio-ca"}, time.Hour, w.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(w.dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	ag := testkit.RunAgent(t, agent.Config{
		CAAddr:            ca.Addr().String(),
		CARootFile:        filepath.Join(w.caDir, "root-cert.pem"),
		TokenFile:         tokenFile,
		SDSSocket:         filepath.Join(w.dir, "sds.sock"),
		WorkloadAPISocket: filepath.Join(w.dir, "workload.sock"),
		TrustDomain:       td,
		MonitoringListen:  "127.0.0.1:0",
		Registerer:        agentReg,
		Gatherer:          agentReg,
		Logger:            discard,
	})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if _, err := ag.Manager().Secret(ctx, secretcache.DefaultName); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		what string
		reg  *recorder
		url  string
	}{
		{"CA", caReg, "http://" + ca.MonitoringAddr().String() + "/metrics"},
		{"agent", agentReg, "http://" + ag.MonitoringAddr().String() + "/metrics"},
	} {
		if len(c.reg.names) < 10 {
			t.Fatalf("%s registered %d metrics: the recorder misses registrations", c.what, len(c.reg.names))
		}
		for name := range c.reg.names {
			if !strings.Contains(string(ref), "| `"+name+"` |") {
				t.Errorf("%s registers %s, which %s does not list: run `%s`", c.what, name, metricsref.File, metricsref.Regenerate)
			}
		}
		code, body := testkit.HTTPGet(t, c.url)
		if code != 200 {
			t.Fatalf("%s /metrics: %d", c.what, code)
		}
		problems, err := promlint.New(strings.NewReader(body)).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s /metrics: promlint: %s: %s", c.what, p.Metric, p.Text)
		}
		for _, line := range strings.Split(body, "\n") {
			if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
				name = strings.Fields(name)[0]
				if !strings.Contains(string(ref), "`"+name+"`") {
					t.Errorf("%s serves %s, which %s does not name", c.what, name, metricsref.File)
				}
			}
		}
	}
	// The agent's renamed metrics are served under their old names too.
	_, body := testkit.HTTPGet(t, "http://"+ag.MonitoringAddr().String()+"/metrics")
	for _, name := range []string{"meshid_agent_workloadapi_streams", "meshid_workloadapi_streams"} {
		if !strings.Contains(body, "# TYPE "+name+" ") {
			t.Errorf("agent /metrics has no %s", name)
		}
	}
}
