package agent_test

import (
	"context"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/testkit"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/secretdump"
)

// TestDebugSecrets: /debug/secrets serves the chain and roots the agent
// holds, and nothing of the key, on a listener on every interface without
// DebugEndpoints, to loopback peers only; it never makes the agent contact
// the CA, however often it is asked.
func TestDebugSecrets(t *testing.T) {
	w := newWorld(t)
	a, sec, _ := w.runMonitored(t, "0.0.0.0:0", nil)
	_, port, _ := net.SplitHostPort(a.MonitoringAddr().String())
	url := "http://127.0.0.1:" + port + secretdump.Path

	code, body := testkit.HTTPGet(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	d, err := secretdump.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if d.Identity != "spiffe://cluster.local/ns/default/sa/default" || !d.Ready || len(d.Secrets) != 2 {
		t.Fatalf("dump: %+v", d)
	}
	chain, err := d.Secrets[0].Certificates()
	if err != nil || d.Secrets[0].Name != secretcache.DefaultName || len(chain) != len(sec.Chain) || !chain[0].Equal(sec.Chain[0]) || d.Secrets[0].Version != sec.Version {
		t.Fatalf("default: %v %+v", err, d.Secrets[0])
	}
	roots, err := d.Secrets[1].Certificates()
	rootPEM, _ := os.ReadFile(w.rootFile)
	if err != nil || d.Secrets[1].Name != secretcache.RootName || string(certs.EncodeCertificates(roots...)) != string(rootPEM) {
		t.Fatalf("ROOTCA: %v %+v", err, d.Secrets[1])
	}
	assertNoKey(t, body, sec)

	// Read-only: a thousand requests, no new certificate.
	for range 1000 {
		if code, _ := testkit.HTTPGet(t, url); code != http.StatusOK {
			t.Fatalf("GET: %d", code)
		}
	}
	if got := firstSecret(t, a); got.Version != sec.Version {
		t.Fatal("/debug/secrets made the agent renew")
	}
	// After a rotation it shows the new certificate, still without a key.
	if err := a.Manager().Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	rotated := firstSecret(t, a)
	_, body = testkit.HTTPGet(t, url)
	if !strings.Contains(body, rotated.Version) || strings.Contains(body, sec.Version) {
		t.Fatalf("after rotation the dump shows %s", body)
	}
	assertNoKey(t, body, rotated)
	assertNoKey(t, body, sec)

	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %s", resp.Status)
	}
	if ip := testkit.NonLoopbackIP(); ip != "" {
		if code, _ := testkit.HTTPGet(t, "http://"+net.JoinHostPort(ip, port)+secretdump.Path); code != http.StatusForbidden {
			t.Fatalf("peer %s: %d, want 403", ip, code)
		}
	}
}

// assertNoKey fails if body holds any part of sec's private key: its PEM
// type, any line of its PEM body, or its DER.
func assertNoKey(t *testing.T, body string, sec *secretcache.Secret) {
	t.Helper()
	keyPEM, err := certs.EncodePrivateKey(sec.Key)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(body, "PRIVATE KEY") {
		t.Fatal("the dump holds a PEM private key")
	}
	block, _ := pem.Decode(keyPEM)
	if strings.Contains(body, string(block.Bytes)) {
		t.Fatal("the dump holds the key's DER")
	}
	for _, line := range strings.Split(string(keyPEM), "\n") {
		if len(line) >= 16 && !strings.HasPrefix(line, "-----") && strings.Contains(body, line) {
			t.Fatalf("the dump holds a line of the key: %s", line)
		}
	}
}

// TestDebugSecretsReason: an agent the CA refuses says why in its dump,
// with no secrets.
func TestDebugSecretsReason(t *testing.T) {
	w := newWorld(t)
	iss, err := devissuer.LoadOrCreate(t.TempDir(), "https://someone.else")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := iss.Mint("default", "default", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := w.config()
	cfg.MonitoringListen = "127.0.0.1:0"
	a := testkit.RunAgent(t, cfg)
	if _, err := a.Manager().Secret(context.Background(), secretcache.DefaultName); err == nil {
		t.Fatal("the CA accepted a foreign token")
	}
	_, body := testkit.HTTPGet(t, "http://"+a.MonitoringAddr().String()+secretdump.Path)
	d, err := secretdump.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if d.Ready || len(d.Secrets) != 0 || !strings.Contains(d.Reason, "last CA failure") || !strings.Contains(d.Reason, "Unauthenticated") {
		t.Fatalf("dump of a refused agent: %+v", d)
	}
}

// TestDebugSecretsNeverKeys is the attacker's test of /debug/secrets: an
// SDS client makes the agent load a key from disk (file-cert:), and the
// dump still holds neither that key nor the workload key; headers that
// claim a loopback client do not get a non-loopback peer in.
func TestDebugSecretsNeverKeys(t *testing.T) {
	w := newWorld(t)
	dir := t.TempDir()
	root, rootKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "file root"}, TTL: time.Hour})
	keyPEM, err := certs.EncodePrivateKey(rootKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certs.EncodeCertificates(root), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := w.config()
	cfg.MonitoringListen, cfg.FileSecretDirs = "0.0.0.0:0", []string{dir}
	a := testkit.RunAgent(t, cfg)
	sec := firstSecret(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	fileSec, err := a.Manager().Secret(ctx, "file-cert:"+certFile+"~"+keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if fileSec.Key == nil {
		t.Fatal("the file secret holds no key: the test would prove nothing")
	}
	_, port, _ := net.SplitHostPort(a.MonitoringAddr().String())
	code, body := testkit.HTTPGet(t, "http://127.0.0.1:"+port+secretdump.Path)
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	assertNoKey(t, body, sec)
	assertNoKey(t, body, fileSec)

	ip := testkit.NonLoopbackIP()
	if ip == "" {
		testkit.SkipOrFail(t, "no non-loopback address to be another pod from")
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+net.JoinHostPort(ip, port)+secretdump.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"X-Forwarded-For", "X-Real-Ip", "Forwarded"} {
		req.Header.Set(h, "127.0.0.1")
	}
	req.Host = "localhost"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("non-loopback peer claiming 127.0.0.1 in headers: %s, want 403", resp.Status)
	}
}

// TestDebugSecretsOff: DisableDebugSecrets (--debug-secrets=false) turns
// the dump off, to loopback peers too, with a 404 that says so (what
// `meshid inspect --pod` shows); the rest of monitoring still serves.
func TestDebugSecretsOff(t *testing.T) {
	w := newWorld(t)
	cfg := w.config()
	cfg.MonitoringListen, cfg.DisableDebugSecrets = "127.0.0.1:0", true
	a := testkit.RunAgent(t, cfg)
	firstSecret(t, a)
	base := "http://" + a.MonitoringAddr().String()
	code, body := testkit.HTTPGet(t, base+secretdump.Path)
	if code != http.StatusNotFound || !strings.Contains(body, secretdump.OffMessage) || strings.Contains(body, "CERTIFICATE") {
		t.Fatalf("GET with the dump off: %d %q", code, body)
	}
	if code, _ := testkit.HTTPGet(t, base+"/metrics"); code != http.StatusOK {
		t.Fatalf("/metrics with the dump off: %d", code)
	}
}
