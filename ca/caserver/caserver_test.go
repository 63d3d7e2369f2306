package caserver_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// TestServe: the assembled CA on a self-signed root in its state directory
// writes root-cert.pem, authenticates the configured JWT issuer's tokens,
// signs for a real agent, and reports ready on /readyz.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("example.org")
	s := testkit.CA(t, caserver.Config{
		TrustDomain: td,
		StateDir:    dir,
		Authn: caserver.AuthnConfig{
			JWTIssuer: iss.Issuer(),
			JWKSFile:  filepath.Join(dir, devissuer.JWKSFile),
		},
		Monitoring: caserver.MonitoringConfig{
			Listen: "127.0.0.1:0",
		},
	})
	if s.Authority() == nil || s.Authority().TrustDomain() != td {
		t.Fatalf("authority %v, want one for %s", s.Authority(), td)
	}
	pem, err := os.ReadFile(filepath.Join(dir, "root-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := certs.ParseCertificates(pem)
	if err != nil || !roots[0].Equal(s.Authority().Bundle().Roots[0]) {
		t.Fatalf("root-cert.pem is not the authority's root (%v)", err)
	}

	tok, err := iss.Mint("ns1", "sa1", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	a := testkit.RunAgent(t, agent.Config{CAAddr: s.Addr().String(), CARootFile: filepath.Join(dir, "root-cert.pem"), TokenFile: tokenFile, TrustDomain: td})
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	sec, err := a.Manager().Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	if got := sec.Chain[0].URIs[0].String(); got != "spiffe://example.org/ns/ns1/sa/sa1" {
		t.Fatalf("issued %s", got)
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready after serving: %v", err)
	}
	if code, body := testkit.HTTP(t, http.MethodGet, "http://"+s.MonitoringAddr().String()+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz: %d %s", code, body)
	}
}

// TestNotReadyBeforeRun: a built CA that does not serve yet is not ready.
func TestNotReadyBeforeRun(t *testing.T) {
	s, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err == nil {
		t.Fatal("ready before Run")
	}
	if s.Addr() != nil || s.MonitoringAddr() != nil {
		t.Fatal("addresses before Listen")
	}
}

// TestDefaults: the zero Config serves the trust domain and TTLs of
// `meshid server`'s defaults.
func TestDefaults(t *testing.T) {
	s, err := caserver.New(caserver.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Authority().TrustDomain().Name(); got != caserver.DefaultTrustDomain {
		t.Fatalf("trust domain %s", got)
	}
	if k := s.Authority().Bundle().Roots[0].PublicKeyAlgorithm.String(); k != "ECDSA" {
		t.Fatalf("root key %s, want the default ec-p256", k)
	}
}

// TestConfigErrors: each bad Config is refused for its own reason (the
// error says which); the base, a state directory alone, is accepted.
func TestConfigErrors(t *testing.T) {
	if _, err := caserver.New(caserver.Config{StateDir: t.TempDir()}); err != nil {
		t.Fatalf("the base configuration: %v", err)
	}
	for name, tc := range map[string]struct {
		cfg  caserver.Config
		want string
	}{
		"kube CA secret without a cluster": {caserver.Config{KubeCASecret: true}, "KubeCASecret needs a Kubernetes client"},
		"bad root key type":                {caserver.Config{RootKeyType: "dsa-1024"}, `RootKeyType: certs: unknown key type "dsa-1024"`},
		"negative TTL":                     {caserver.Config{Issuance: caserver.IssuanceConfig{DefaultTTL: -time.Hour}}, "Issuance.DefaultTTL -1h0m0s is negative"},
		"negative rate limit":              {caserver.Config{Limits: caserver.LimitsConfig{Rate: -1}}, "Limits.Rate -1 is negative"},
		"missing CA dir":                   {caserver.Config{CADir: filepath.Join(t.TempDir(), "absent")}, "--ca-dir "},
		"JWT-SVID TTL over 1h":             {caserver.Config{JWT: caserver.JWTConfig{SVIDTTL: jwtissuer.MaxTTL + time.Second}}, "JWT.SVIDTTL 1h0m1s is not within"},
		"negative JWT-SVID TTL":            {caserver.Config{JWT: caserver.JWTConfig{SVIDTTL: -time.Second}}, "JWT.SVIDTTL -1s is not within"},
		"JWT key lifetime under 10m":       {caserver.Config{JWT: caserver.JWTConfig{KeyLifetime: jwtkeys.MinLifetime - time.Second}}, "key lifetime"},
		"JWT key lifetime over 30 days":    {caserver.Config{JWT: caserver.JWTConfig{KeyLifetime: jwtkeys.MaxLifetime + time.Second}}, "key lifetime"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.cfg.StateDir = t.TempDir()
			if _, err := caserver.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestJWTKeysSurviveARestart: without a cluster the JWT-SVID signing keys
// live in the state directory (0600), and a restarted CA signs with them,
// so the tokens it issued before still validate.
func TestJWTKeysSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	if _, err := caserver.New(caserver.Config{StateDir: dir, JWT: caserver.JWTConfig{KeyLifetime: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, jwtkeys.FileName)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	if _, err := caserver.New(caserver.Config{StateDir: dir, JWT: caserver.JWTConfig{KeyLifetime: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a restart replaced the JWT signing keys")
	}
	if err := os.WriteFile(path, []byte(`{"version":1,"keys":[{"jwk":{"kty":"oct","k":"c2VjcmV0"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := caserver.New(caserver.Config{StateDir: dir}); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("a symmetric key in %s: err = %v, want an error naming the file", path, err)
	}
}

// TestCADirErrorNamesTheProblem: a CA directory that cannot be loaded is
// refused with the loader's error, naming the directory.
func TestCADirErrorNamesTheProblem(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	_, err := caserver.New(caserver.Config{StateDir: t.TempDir(), CADir: dir})
	if err == nil || !strings.Contains(err.Error(), "--ca-dir "+dir+": ") {
		t.Fatalf("New with CA dir %s: %v, want an error naming the flag and the directory", dir, err)
	}
}

// TestWarnsWithoutTokenAuthenticator: a CA with no way to authenticate a
// token (no cluster, no JWKS file, no JWT issuer, no extra authenticator)
// says so at startup, and one with a JWT issuer does not.
func TestWarnsWithoutTokenAuthenticator(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg  caserver.Config
		warn bool
	}{
		"none":       {caserver.Config{}, true},
		"JWT issuer": {caserver.Config{Authn: caserver.AuthnConfig{JWTIssuer: iss.Issuer(), JWKSFile: filepath.Join(dir, devissuer.JWKSFile)}}, false},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			cfg := tc.cfg
			cfg.StateDir = t.TempDir()
			cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
			if _, err := caserver.New(cfg); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(buf.String(), "no token authenticator"); got != tc.warn {
				t.Fatalf("warned %v, want %v: %q", got, tc.warn, buf.String())
			}
		})
	}
}

// TestListenBeforeRun: Listen binds the gRPC and the monitoring addresses,
// so both accept connections before Run.
func TestListenBeforeRun(t *testing.T) {
	s, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Listen: "127.0.0.1:0", Monitoring: caserver.MonitoringConfig{Listen: "127.0.0.1:0"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []net.Addr{s.Addr(), s.MonitoringAddr()} {
		if addr == nil {
			t.Fatal("an address is unknown after Listen")
		}
		conn, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatalf("%s before Run: %v", addr, err)
		}
		conn.Close()
	}
	testkit.Run(t, "CA", s.Run)
}

// TestCADirFollowsChanges: the CA assembly on a plugged-in --ca-dir
// watches it (a mounted cacerts Secret the kubelet updates in place):
// new CA files are in use without a restart, and broken ones are refused
// while the CA keeps the last good bundle.
func TestCADirFollowsChanges(t *testing.T) {
	writeCA := func(dir string, files map[string][]byte) {
		t.Helper()
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: "example.org"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeCA(dir, files)
	logs := testkit.NewLogRecorder()
	s := testkit.CA(t, caserver.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), CADir: dir, Logger: logs.Logger()})
	if !s.Authority().Bundle().Cert.Equal(first.Cert) {
		t.Fatal("the CA does not sign with the directory's CA")
	}
	logs.WaitFor(t, "watching the CA directory", 1)

	second, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: "example.org"})
	if err != nil {
		t.Fatal(err)
	}
	writeCA(dir, files)
	logs.WaitFor(t, "CA directory reloaded", 1)
	// A new root is prepared first (issue 13): trusted at once, signing
	// only once activated.
	if b := s.Authority().Bundle(); !b.Cert.Equal(first.Cert) || len(b.Roots) != 2 || !b.Roots[1].Equal(second.Cert) {
		t.Fatalf("after the directory changed: signing %q with %d roots, want the first CA with both roots", b.Cert.Subject, len(b.Roots))
	}
	if err := s.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	if !s.Authority().Bundle().Cert.Equal(second.Cert) {
		t.Fatal("the CA did not follow the directory")
	}

	if err := os.WriteFile(filepath.Join(dir, keystore.CAKeyFile), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs.WaitFor(t, "CA directory update refused", 1)
	if !s.Authority().Bundle().Cert.Equal(second.Cert) {
		t.Fatal("a broken directory replaced the CA")
	}
}

// TestBuildInfoGauge: the CA registers meshid_build_info (1) on its registry.
func TestBuildInfoGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if v := testkit.Metric(t, reg, "meshid_build_info", "goversion", runtime.Version()); v != 1 {
		t.Fatalf("meshid_build_info = %v", v)
	}
}

// The self-signed root rotates through the state directory: a new root
// waits in next/ while root-cert.pem holds both roots; once activated it
// replaces the old one, and a restart signs with it.
func TestSelfSignedRootRotationStateDir(t *testing.T) {
	dir := t.TempDir()
	cfg := caserver.Config{StateDir: dir, Registerer: prometheus.NewRegistry()}
	s, err := caserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	old := s.Authority().Bundle().Cert
	if err := s.Rotation().RotateRoot(); err != nil {
		t.Fatal(err)
	}
	readRoots := func() []*x509.Certificate { return testkit.ReadCerts(t, filepath.Join(dir, keystore.RootCertFile)) }
	if roots := readRoots(); len(roots) != 2 || !roots[0].Equal(old) {
		t.Fatalf("prepared: root-cert.pem holds %d roots, want the old and the new", len(roots))
	}
	if st, err := os.Stat(filepath.Join(dir, "next", keystore.CAKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("prepared key: %v %v", st, err)
	}
	next := s.Rotation().Status().Prepared
	if err := s.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "next")); !os.IsNotExist(err) {
		t.Fatalf("next/ still there after activation: %v", err)
	}
	if roots := readRoots(); len(roots) != 2 {
		t.Fatalf("active: root-cert.pem holds %d roots, want both until retired", len(roots))
	}
	cfg.Registerer = prometheus.NewRegistry()
	again, err := caserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Authority().Bundle().Cert.Equal(next) {
		t.Fatal("after a restart the CA does not sign with the activated root")
	}
}

// A root rotation threshold as long as a root's life would rotate without end.
func TestRootRotationThresholdBounded(t *testing.T) {
	_, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Rotation: caserver.RotationConfig{RootThreshold: keystore.DefaultRootTTL}})
	if err == nil || !strings.Contains(err.Error(), "Rotation.RootThreshold") {
		t.Fatalf("New: %v", err)
	}
}
