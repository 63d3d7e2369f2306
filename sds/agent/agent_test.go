package agent_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/rootfile"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// world is a real CA (the caserver assembly) that authenticates the dev
// issuer's tokens, and a token file for default/default.
type world struct {
	ca        *caserver.Server
	caReg     *prometheus.Registry // the CA's metrics
	rootFile  string
	tokenFile string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w := &world{
		ca: testkit.CA(t, caserver.Config{
			StateDir: dir,
			Authn: caserver.AuthnConfig{
				JWTIssuer: iss.Issuer(),
				JWKSFile:  filepath.Join(dir, devissuer.JWKSFile),
			},
			Registerer: reg,
		}),
		caReg:     reg,
		rootFile:  filepath.Join(dir, "root-cert.pem"),
		tokenFile: filepath.Join(dir, "token"),
	}
	tok, err := iss.Mint("default", "default", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// config is an agent of default/default against the world's CA.
func (w *world) config() agent.Config {
	return agent.Config{CAAddr: w.ca.Addr().String(), CARootFile: w.rootFile, TokenFile: w.tokenFile}
}

// runMonitored runs an agent of w with its monitoring listener on listen
// and cfg changed by change (nil: not at all), and returns it once it holds
// its first certificate, with that certificate and the listener's URL.
func (w *world) runMonitored(t *testing.T, listen string, change func(*agent.Config)) (*agent.Agent, *secretcache.Secret, string) {
	t.Helper()
	cfg := w.config()
	cfg.MonitoringListen = listen
	if change != nil {
		change(&cfg)
	}
	a := testkit.RunAgent(t, cfg)
	return a, firstSecret(t, a), "http://" + a.MonitoringAddr().String()
}

func firstSecret(t *testing.T, a *agent.Agent) *secretcache.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	sec, err := a.Manager().Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// TestJitterReachesManager: the Config's Jitter is the one the agent's
// SecretManager renews with. Each certificate's renewal time (logged) is
// compared with its exact grace point: with Jitter 0.3 none is exact, and
// at least one of ten is further from it than the default jitter (0.01)
// allows (chance of a false failure: (1/30)^10).
func TestJitterReachesManager(t *testing.T) {
	w := newWorld(t)
	logs := testkit.NewLogRecorder()
	cfg := w.config()
	cfg.Jitter, cfg.CertTTL, cfg.Logger = 0.3, time.Hour, logs.Logger()
	a := testkit.RunAgent(t, cfg)
	firstSecret(t, a)
	beyondDefault := false
	for i := range 10 {
		if i > 0 {
			if err := a.Manager().Rotate(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		leaf := firstSecret(t, a).Chain[0]
		renew := renewAt(t, logs, leaf.SerialNumber.Text(16))
		life := leaf.NotAfter.Sub(leaf.NotBefore)
		off := renew.Sub(leaf.NotBefore.Add(life / 2))
		if off.Abs() < time.Millisecond {
			t.Fatalf("certificate %d renews at its exact grace point %v: no jitter", i, renew)
		}
		if off.Abs() > time.Duration(0.3*float64(life))+time.Second {
			t.Fatalf("certificate %d renews %v from its grace point, more than the jitter 0.3 of %v", i, off, life)
		}
		if off.Abs() > time.Duration(0.01*float64(life))+time.Second {
			beyondDefault = true
		}
	}
	if !beyondDefault {
		t.Fatal("ten renewals all within the default jitter (0.01): Jitter 0.3 did not reach the SecretManager")
	}
}

var renewRE = regexp.MustCompile(`renew_at=(\S+ \S+ \S+ \S+)`)

// renewAt is the renewal time the agent logged for the certificate serial.
func renewAt(t *testing.T, logs *testkit.LogRecorder, serial string) time.Time {
	t.Helper()
	for _, l := range strings.Split(logs.All(), "\n") {
		if !strings.HasPrefix(l, "workload certificate issued") || !strings.Contains(l, "serial="+serial+" ") {
			continue
		}
		m := renewRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("no renew_at in %q", l)
		}
		at, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", m[1])
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	t.Fatalf("no issuance logged for serial %s:\n%s", serial, logs.All())
	return time.Time{}
}

// TestNoJitter: NoJitter renews exactly at the grace point.
func TestNoJitter(t *testing.T) {
	w := newWorld(t)
	logs := testkit.NewLogRecorder()
	cfg := w.config()
	cfg.Jitter, cfg.CertTTL, cfg.Logger = agent.NoJitter, time.Hour, logs.Logger()
	a := testkit.RunAgent(t, cfg)
	leaf := firstSecret(t, a).Chain[0]
	want := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	if got := renewAt(t, logs, leaf.SerialNumber.Text(16)); !got.Equal(want) {
		t.Fatalf("renew at %v, want exactly %v", got, want)
	}
}

// TestRotateEndpoint: POST /debug/rotate on the agent's monitoring listener
// renews the workload certificate; other methods are refused and rotate
// nothing.
func TestRotateEndpoint(t *testing.T) {
	a, before, base := newWorld(t).runMonitored(t, "127.0.0.1:0", func(c *agent.Config) { c.DebugEndpoints = true })
	url := base + "/debug/rotate"

	if code, _ := testkit.HTTP(t, http.MethodGet, url); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d, want 405", code)
	}
	if got := firstSecret(t, a); got.Version != before.Version {
		t.Fatal("GET rotated the certificate")
	}

	if code, body := testkit.HTTP(t, http.MethodPost, url); code != http.StatusOK || strings.TrimSpace(body) != "rotated" {
		t.Fatalf("POST: %d %q", code, body)
	}
	after := firstSecret(t, a)
	if after.Version == before.Version || after.Chain[0].SerialNumber.Cmp(before.Chain[0].SerialNumber) == 0 {
		t.Fatal("POST /debug/rotate answered rotated but the certificate is the same")
	}
}

// TestDebugEndpointsOptIn: without DebugEndpoints there is no
// /debug/rotate (an unauthenticated way to make the agent call the CA), and
// with it the monitoring listener must be loopback (security review,
// hole 6).
func TestDebugEndpointsOptIn(t *testing.T) {
	w := newWorld(t)
	a, before, base := w.runMonitored(t, "127.0.0.1:0", nil)
	if code, _ := testkit.HTTP(t, http.MethodPost, base+"/debug/rotate"); code != http.StatusNotFound {
		t.Fatalf("POST /debug/rotate without DebugEndpoints: %d, want 404", code)
	}
	if got := firstSecret(t, a); got.Version != before.Version {
		t.Fatal("the certificate rotated")
	}

	for _, listen := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		cfg := w.config()
		cfg.MonitoringListen, cfg.DebugEndpoints = listen, true
		if _, err := agent.New(cfg); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("DebugEndpoints on %s: %v, want a loopback error", listen, err)
		}
	}
}

// TestReadyz: the agent's /readyz turns ready with its first certificate.
func TestReadyz(t *testing.T) {
	a, _, base := newWorld(t).runMonitored(t, "127.0.0.1:0", nil)
	if err := a.Ready(); err != nil {
		t.Fatal(err)
	}
	if code, body := testkit.HTTP(t, http.MethodGet, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz: %d %s", code, body)
	}
}

// TestConfigErrors: each bad Config is refused for its own reason (the
// error says which), on an otherwise valid fixture: a root file that
// parses and a token file that exists.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("not read: the names are given"), 0o600); err != nil {
		t.Fatal(err)
	}
	many := rootsFile(t, rootfile.DefaultMaxRoots+1)
	good := rootsFile(t, 2)
	manyRoots, err := certs.ParseCertificates(mustRead(t, many))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg  agent.Config
		want string
	}{
		"no CA roots":          {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok}, "--ca-root is required"},
		"missing root file":    {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CARootFile: filepath.Join(dir, "absent.pem")}, "absent.pem"},
		"bad key type":         {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, KeyType: "dsa-1024", CARootFile: good}, "key type"},
		"negative TTL":         {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CertTTL: -time.Hour, CARootFile: good}, "CertTTL -1h0m0s is negative"},
		"negative MaxCARoots":  {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, MaxCARoots: -1, CARootFile: good}, "MaxCARoots"},
		"no token, no names":   {agent.Config{TokenFile: filepath.Join(dir, "absent"), CARootFile: good}, "--token-file"},
		"system CA bundle":     {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CARootFile: rootfile.SystemBundles[0]}, rootfile.SystemBundles[0] + " is the system CA bundle"},
		"17 roots in the file": {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CARootFile: many}, "--ca-root: " + many + ": 17 certificates"},
		"over MaxCARoots":      {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CARootFile: good, MaxCARoots: 1}, good + ": 2 certificates"},
		"17 CARoots":           {agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CARoots: manyRoots}, "Config.CARoots: 17 certificates"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := agent.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error containing %q", err, tc.want)
			}
		})
	}
	// The fixture itself is valid: the same Config without its defect
	// builds.
	if _, err := agent.New(agent.Config{Namespace: "ns", ServiceAccount: "sa", TokenFile: tok, CARootFile: good, MonitoringListen: ""}); err != nil {
		t.Fatalf("the valid fixture: %v", err)
	}
}

// rootsFile writes n new roots to a PEM file.
func rootsFile(t *testing.T, n int) string {
	t.Helper()
	var roots []*x509.Certificate
	for i := range n {
		r, _ := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: fmt.Sprintf("root %d", i)}, TTL: time.Hour})
		roots = append(roots, r)
	}
	path := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(path, certs.EncodeCertificates(roots...), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestRotationUnionAccepted: during a CA rotation --ca-root holds the old
// and the new root (test/e2e/carotation_test.go); the root limit accepts
// it and the agent verifies the CA with it and gets its certificate. (The
// file's roots join ROOTCA at the re-read: sds/secretcache's
// TestRootsUnionWithRootFile and TestRootFileRefusedKeepsRoots.)
func TestRotationUnionAccepted(t *testing.T) {
	w := newWorld(t)
	next, _ := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "next root"}, TTL: time.Hour})
	union := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(union, append(certs.EncodeCertificates(next), mustRead(t, w.rootFile)...), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := w.config()
	cfg.CARootFile = union
	if sec := firstSecret(t, testkit.RunAgent(t, cfg)); len(sec.Chain) == 0 {
		t.Fatal("no certificate")
	}
}

// TestManagerConfigDefaults: the zero Config runs the SecretManager with
// the documented defaults (those of the agent's flags).
func TestManagerConfigDefaults(t *testing.T) {
	mc, err := agent.Config{}.ManagerConfig(nil, spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/default"))
	if err != nil {
		t.Fatal(err)
	}
	if mc.TTL != agent.DefaultCertTTL || mc.GraceRatio != agent.DefaultGraceRatio || mc.Jitter != agent.DefaultJitter || mc.KeyType != agent.DefaultKeyType {
		t.Fatalf("defaults: %+v", mc)
	}
	mc, err = agent.Config{Jitter: agent.NoJitter}.ManagerConfig(nil, spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/default"))
	if err != nil {
		t.Fatal(err)
	}
	if mc.Jitter >= 0 {
		t.Fatalf("NoJitter reached the manager as %v, which is not 'none'", mc.Jitter)
	}
}

// TestLean: the agent links neither the CA side, client-go, cfssl nor
// plotting (the agent runs beside every pod).
func TestLean(t *testing.T) {
	for _, pkg := range []string{"github.com/meshid/meshid/sds/agent", "github.com/meshid/meshid/cmd/meshid-agent"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("go list %s: %v\n%s", pkg, err, ee.Stderr)
			}
			t.Fatal(err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, banned := range []string{"github.com/meshid/meshid/ca", "k8s.io/client-go", "github.com/cloudflare/cfssl", "gonum.org/"} {
				if dep == banned || strings.HasPrefix(dep, banned+"/") || (strings.HasSuffix(banned, "/") && strings.HasPrefix(dep, banned)) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
}

// TestWorkloadAPI: with WorkloadAPISocket the agent serves the SPIFFE
// Workload API from the same cache as SDS: go-spiffe's client gets the
// certificate SDS serves, and a forced rotation reaches both.
func TestWorkloadAPI(t *testing.T) {
	w := newWorld(t)
	cfg := w.config()
	cfg.WorkloadAPISocket = filepath.Join(testkit.ShortDir(t), "workload.sock")
	a := testkit.RunAgent(t, cfg)
	sdsSecret := firstSecret(t, a)

	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr("unix://"+cfg.WorkloadAPISocket)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	svid, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	if !svid.Certificates[0].Equal(sdsSecret.Chain[0]) || svid.ID.String() != "spiffe://cluster.local/ns/default/sa/default" {
		t.Fatalf("Workload API SVID %s (serial %x) is not the SDS certificate (serial %x)", svid.ID, svid.Certificates[0].SerialNumber, sdsSecret.Chain[0].SerialNumber)
	}
	if err := a.Manager().Rotate(ctx); err != nil {
		t.Fatal(err)
	}
	rotated := firstSecret(t, a)
	for {
		select {
		case <-src.Updated():
		case <-ctx.Done():
			t.Fatal("the rotation did not reach the Workload API")
		}
		if s, err := src.GetX509SVID(); err == nil && s.Certificates[0].Equal(rotated.Chain[0]) {
			return
		}
	}
}

// TestIdentitySource: the workload identity comes from Namespace and
// ServiceAccount when both are set (the token is not consulted), and from
// the token's kubernetes.io claims when either is missing.
func TestIdentitySource(t *testing.T) {
	w := newWorld(t) // its token is for default/default
	for name, tc := range map[string]struct {
		ns, sa string
		want   string
	}{
		"both set":        {"ns1", "sa1", "spiffe://cluster.local/ns/ns1/sa/sa1"},
		"namespace only":  {"ns1", "", "spiffe://cluster.local/ns/default/sa/default"},
		"service account": {"", "sa1", "spiffe://cluster.local/ns/default/sa/default"},
		"neither":         {"", "", "spiffe://cluster.local/ns/default/sa/default"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := w.config()
			cfg.Namespace, cfg.ServiceAccount = tc.ns, tc.sa
			if got := testkit.RunAgent(t, cfg).Manager().ID().String(); got != tc.want {
				t.Fatalf("identity %s, want %s", got, tc.want)
			}
		})
	}
}

// TestListenBeforeRun: Listen binds the monitoring address as well as the
// SDS socket, so both accept connections before Run.
func TestListenBeforeRun(t *testing.T) {
	w := newWorld(t)
	cfg := w.config()
	cfg.MonitoringListen = "127.0.0.1:0"
	cfg.SDSSocket = filepath.Join(testkit.ShortDir(t), "sds.sock")
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	addr := a.MonitoringAddr()
	if addr == nil {
		t.Fatal("no monitoring address after Listen")
	}
	for _, c := range []struct{ network, addr string }{{"tcp", addr.String()}, {"unix", a.SocketPath()}} {
		conn, err := net.Dial(c.network, c.addr)
		if err != nil {
			t.Fatalf("%s %s before Run: %v", c.network, c.addr, err)
		}
		conn.Close()
	}
	testkit.Run(t, "agent", a.Run)
}

// TestMetricsServed: the agent's own metrics (its SecretManager's and SDS
// server's) are served on /metrics with no Registerer given, and with a
// Registerer that is also a Gatherer and no Gatherer given.
func TestMetricsServed(t *testing.T) {
	w := newWorld(t)
	for name, reg := range map[string]prometheus.Registerer{"defaults": nil, "registerer only": prometheus.NewRegistry()} {
		t.Run(name, func(t *testing.T) {
			_, _, base := w.runMonitored(t, "127.0.0.1:0", func(c *agent.Config) { c.Registerer = reg })
			code, body := testkit.HTTP(t, http.MethodGet, base+"/metrics")
			if code != http.StatusOK || !strings.Contains(body, "meshid_") {
				t.Fatalf("/metrics: %d, no meshid_ series in %d bytes", code, len(body))
			}
		})
	}
}

// TestBuildInfoGauge: the agent registers meshid_build_info (1) on its registry.
func TestBuildInfoGauge(t *testing.T) {
	w := newWorld(t)
	cfg := w.config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if _, err := agent.New(cfg); err != nil {
		t.Fatal(err)
	}
	if v := testkit.Metric(t, reg, "meshid_build_info", "goversion", runtime.Version()); v != 1 {
		t.Fatalf("meshid_build_info = %v", v)
	}
}
