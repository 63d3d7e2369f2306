package testkit

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	expiry    time.Duration
	key       string // the auth key in hex
	roots     int    // roots made so far
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
	return buildBinary(t, "build-cfssl.sh")
}

// StartCFSSL starts cfssl serve whose CA profile issues intermediates for
// expiry (a Go duration), until the test ends.
func StartCFSSL(t testing.TB, expiry time.Duration) *CFSSL {
	t.Helper()
	dir := t.TempDir()
	c := &CFSSL{bin: CFSSLBinary(t), dir: dir}
	c.expiry, c.key = expiry, hex.EncodeToString(hmacKey(t))
	c.newRoot(t)
	c.configure(t, 0)
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
	c.write(t, map[string][]byte{
		"tls.pem": certs.EncodeCertificates(tlsCert), "tls-key.pem": tk, "tls-ca.pem": certs.EncodeCertificates(tlsRoot),
		"auth.key": []byte(c.key + "\n"),
	})
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

// newRoot makes a new upstream root and writes it as cfssl's CA (read at
// the next Start).
func (c *CFSSL) newRoot(t testing.TB) {
	t.Helper()
	c.roots++
	root, rootKey := Root(t, certs.CASpec{Subject: pkix.Name{CommonName: fmt.Sprintf("corp root CA (cfssl) %d", c.roots)}, NotBefore: time.Now().Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: 1})
	rk, err := certs.EncodePrivateKey(rootKey)
	if err != nil {
		t.Fatal(err)
	}
	c.write(t, map[string][]byte{"ca.pem": certs.EncodeCertificates(root), "ca-key.pem": rk})
	c.Root = root
}

// configure writes cfssl's signing config; backdate is the profiles'
// backdate (0: cfssl's default of 5 minutes; negative dates the
// certificates in the future).
func (c *CFSSL) configure(t testing.TB, backdate time.Duration) {
	t.Helper()
	ca := map[string]any{
		"expiry": c.expiry.String(), "usages": []string{"cert sign", "crl sign"}, "auth_key": "meshid",
		"ca_constraint": map[string]any{"is_ca": true, "max_path_len": 0, "max_path_len_zero": true},
	}
	leaf := map[string]any{"expiry": c.expiry.String(), "usages": []string{"digital signature"}, "auth_key": "meshid"}
	if backdate != 0 {
		ca["backdate"], leaf["backdate"] = backdate.String(), backdate.String()
	}
	conf, _ := json.Marshal(map[string]any{
		"signing": map[string]any{
			"default":  map[string]any{"expiry": "1h", "usages": []string{"digital signature"}},
			"profiles": map[string]any{CFSSLProfileCA: ca, CFSSLProfileLeaf: leaf},
		},
		"auth_keys": map[string]any{"meshid": map[string]string{"type": "standard", "key": c.key}},
	})
	c.write(t, map[string][]byte{"config.json": conf})
}

func (c *CFSSL) write(t testing.TB, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// SetClock restarts cfssl so that what it signs from now on is dated as
// if its clock read now (cfssl has no clock to inject: its profiles'
// backdate moves its notBefore; a minute of backdate stays). A test on a
// fake clock calls it before the mint it wants dated at the fake time.
func (c *CFSSL) SetClock(t testing.TB, now time.Time) {
	t.Helper()
	c.Stop()
	backdate := time.Since(now) + time.Minute
	if backdate == 0 {
		backdate = time.Nanosecond // 0 would be cfssl's default
	}
	c.configure(t, backdate)
	c.Start(t)
}

// NewRoot restarts cfssl signing under a new root (the upstream's root
// rotated); Root is the new one.
func (c *CFSSL) NewRoot(t testing.TB) {
	t.Helper()
	c.Stop()
	c.newRoot(t)
	c.Start(t)
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
	startProcess(t, cmd, "Now listening", c.Addr, "cfssl serve")
	c.mu.Lock()
	c.cmd = cmd
	c.mu.Unlock()
}

// Stop stops cfssl serve (the upstream goes down).
func (c *CFSSL) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopProcess(c.cmd)
	c.cmd = nil
}
