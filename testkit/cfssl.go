package testkit

import (
	"bufio"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
)

// CFSSL is a real `cfssl serve` (built by scripts/build-cfssl.sh at the
// version go.mod pins) on loopback TLS, with one auth key and two
// authenticated profiles: ProfileCA (ca_constraint, the meshid
// intermediate) and ProfileLeaf (not a CA: an answer meshid must refuse).
type CFSSL struct {
	Addr      string            // 127.0.0.1:PORT
	Root      *x509.Certificate // the upstream root cfssl signs with
	TLSCAFile string            // PEM root of cfssl's TLS certificate (ca=)
	KeyFile   string            // the auth key in hex, mode 0600
	bin, dir  string
	mu        sync.Mutex
	cmd       *exec.Cmd
}

// Profiles of a CFSSL.
const (
	CFSSLProfileCA   = "meshid-intermediate"
	CFSSLProfileLeaf = "leaf"
)

// CFSSLBinary builds (once per machine, cached) and returns the cfssl binary.
func CFSSLBinary(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "scripts", "build-cfssl.sh")
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		t.Fatalf("building cfssl (%s): %v", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// StartCFSSL starts cfssl serve whose CA profile issues intermediates for
// expiry (a Go duration), until the test ends.
func StartCFSSL(t testing.TB, expiry time.Duration) *CFSSL {
	t.Helper()
	dir := t.TempDir()
	c := &CFSSL{bin: CFSSLBinary(t), dir: dir}
	root, rootKey := Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "corp root CA (cfssl)"}, NotBefore: time.Now().Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 1})
	c.Root = root
	rk, err := certs.EncodePrivateKey(rootKey)
	if err != nil {
		t.Fatal(err)
	}
	tlsRoot, tlsRootKey := Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "cfssl TLS root"}, NotBefore: time.Now().Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: -1})
	tlsKey := Key(t, certs.ECP256)
	tlsCert := Certificate(t, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "cfssl"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, tlsRoot, tlsKey.Public(), tlsRootKey)
	tk, err := certs.EncodePrivateKey(tlsKey)
	if err != nil {
		t.Fatal(err)
	}
	key := hex.EncodeToString(hmacKey(t))
	conf, _ := json.Marshal(map[string]any{
		"signing": map[string]any{
			"default": map[string]any{"expiry": "1h", "usages": []string{"digital signature"}},
			"profiles": map[string]any{
				CFSSLProfileCA: map[string]any{
					"expiry": expiry.String(), "usages": []string{"cert sign", "crl sign"}, "auth_key": "meshid",
					"ca_constraint": map[string]any{"is_ca": true, "max_path_len": 0, "max_path_len_zero": true},
				},
				CFSSLProfileLeaf: map[string]any{
					"expiry": expiry.String(), "usages": []string{"digital signature"}, "auth_key": "meshid",
				},
			},
		},
		"auth_keys": map[string]any{"meshid": map[string]string{"type": "standard", "key": key}},
	})
	files := map[string][]byte{
		"ca.pem": certs.EncodeCertificates(root), "ca-key.pem": rk, "config.json": conf,
		"tls.pem": certs.EncodeCertificates(tlsCert), "tls-key.pem": tk, "tls-ca.pem": certs.EncodeCertificates(tlsRoot),
		"auth.key": []byte(key + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c.TLSCAFile, c.KeyFile = filepath.Join(dir, "tls-ca.pem"), filepath.Join(dir, "auth.key")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Addr = l.Addr().String()
	l.Close()
	c.Start(t)
	t.Cleanup(c.Stop)
	return c
}

// hmacKey returns a new 32-byte HMAC key.
func hmacKey(t testing.TB) []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Start (re)starts cfssl serve on Addr and waits until it accepts
// connections.
func (c *CFSSL) Start(t testing.TB) {
	t.Helper()
	host, port, _ := net.SplitHostPort(c.Addr)
	f := func(n string) string { return filepath.Join(c.dir, n) }
	cmd := exec.Command(c.bin, "serve", "-address", host, "-port", port,
		"-ca", f("ca.pem"), "-ca-key", f("ca-key.pem"), "-config", f("config.json"),
		"-tls-cert", f("tls.pem"), "-tls-key", f("tls-key.pem"), "-loglevel", "1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.cmd = cmd
	c.mu.Unlock()
	listening := make(chan struct{})
	go func() {
		s := bufio.NewScanner(stderr)
		once := sync.Once{}
		for s.Scan() {
			if strings.Contains(s.Text(), "Now listening") {
				once.Do(func() { close(listening) })
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(Guard):
		t.Fatalf("cfssl serve did not listen on %s within %v", c.Addr, Guard)
	}
	// cfssl logs before it binds: connect until it accepts, within Guard.
	deadline := time.Now().Add(Guard)
	for {
		conn, err := net.DialTimeout("tcp", c.Addr, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cfssl serve on %s: %v", c.Addr, err)
		}
		<-time.After(10 * time.Millisecond) // an external process binding, not a step of the code under test
	}
}

// Stop stops cfssl serve (the upstream goes down).
func (c *CFSSL) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		c.cmd = nil
	}
}
