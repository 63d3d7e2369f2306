package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/inspect"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/testkit"
)

const testWorkload = "spiffe://cluster.local/ns/default/sa/default"

// cliHierarchy is a CA made by the CLI itself: certs root, then certs
// intermediate, loaded the way `meshid server --ca-dir` loads it. It is
// made on fake, which must read two days before cliNow (fake clocks only
// move forward), so that leaves issued in the past (to be expired at cliNow)
// fall inside the intermediate's validity; fake then reads cliNow.
type cliHierarchy struct {
	dir, rootDir, caDir string
	bundle              *keystore.Bundle
}

func newCLIHierarchy(t *testing.T, fake *clock.Fake) cliHierarchy {
	t.Helper()
	dir := t.TempDir()
	h := cliHierarchy{dir: dir, rootDir: filepath.Join(dir, "root"), caDir: filepath.Join(dir, "west")}
	if !fake.Now().Equal(cliNow.Add(-48 * time.Hour)) {
		t.Fatalf("newCLIHierarchy: the clock reads %v, want cliNow-48h", fake.Now())
	}
	meshidOK(t, "certs", "root", "--out", h.rootDir)
	meshidOK(t, "certs", "intermediate", "--root", h.rootDir, "--out", h.caDir, "--name", "west", "--ttl", "8760h")
	fake.Set(cliNow)
	b, err := keystore.LoadDir(h.caDir, cliNow)
	if err != nil {
		t.Fatalf("keystore.LoadDir(%s): %v", h.caDir, err)
	}
	h.bundle = b
	return h
}

// authority is the real CA (ca.Authority) signing with the CLI-made
// intermediate, on clk.
func (h cliHierarchy) authority(t *testing.T, clk clock.Clock) *ca.Authority {
	t.Helper()
	a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("cluster.local"), Bundle: h.bundle, Clock: clk, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// writeLeaf has the CA issue a workload certificate at issuedAt (NotBefore
// is a minute earlier, the CA's clock skew) for ttl, and writes the leaf
// and the intermediate (and the key, when withKey) to a file.
func (h cliHierarchy) writeLeaf(t *testing.T, name string, issuedAt time.Time, ttl time.Duration, withKey bool) string {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	csr := testkit.CSR(t, key, spiffeid.RequireFromString(testWorkload))
	chain, _, err := testkit.AuthoritySigner{Authority: h.authority(t, clock.NewFake(issuedAt)), Caller: "default/default (test)"}.Sign(context.Background(), csr, ttl)
	if err != nil {
		t.Fatal(err)
	}
	data := certs.EncodeCertificates(chain...)
	if withKey {
		k, err := certs.EncodePrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, k...)
	}
	p := filepath.Join(h.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInspectRoundTrip: certs root -> certs intermediate -> keystore.LoadDir
// -> ca.Authority issues a leaf -> inspect verifies the whole chain.
func TestInspectRoundTrip(t *testing.T) {
	fake := withCLIClock(t, cliNow.Add(-48*time.Hour))
	h := newCLIHierarchy(t, fake)
	leaf := h.writeLeaf(t, "leaf.pem", cliNow.Add(-2*time.Minute), 12*time.Hour, true)
	roots := filepath.Join(h.rootDir, "root-cert.pem")

	out := meshidOK(t, "inspect", "--roots", roots, leaf)
	for _, want := range []string{"Cert Chain", "true", testWorkload, "11h58m"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	out = meshidOK(t, "inspect", "--verbose", "--roots", roots, leaf, h.caDir)
	for _, want := range []string{"Verified against:    " + roots, "matches", "CA:true, pathlen:0", "L=west"} {
		if !strings.Contains(out, want) {
			t.Errorf("verbose output lacks %q:\n%s", want, out)
		}
	}
}

func TestInspectExitCodes(t *testing.T) {
	fake := withCLIClock(t, cliNow.Add(-48*time.Hour))
	h := newCLIHierarchy(t, fake)
	roots := filepath.Join(h.rootDir, "root-cert.pem")
	good := h.writeLeaf(t, "good.pem", cliNow.Add(-time.Minute), 12*time.Hour, false)
	expired := h.writeLeaf(t, "expired.pem", cliNow.Add(-25*time.Hour), 24*time.Hour, false)
	soon := h.writeLeaf(t, "soon.pem", cliNow.Add(-time.Hour), 90*time.Minute, false)
	other := filepath.Join(h.dir, "other")
	meshidOK(t, "certs", "root", "--out", other)
	otherRoots := filepath.Join(other, "root-cert.pem")

	goodPEM, _ := os.ReadFile(good)
	write := func(name string, data []byte) string {
		p := filepath.Join(h.dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	garbage := write("garbage.pem", []byte("this is not a certificate\n"))
	truncated := write("truncated.pem", goodPEM[:len(goodPEM)/3])
	unknown := write("crl.pem", pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: []byte{1, 2}}))

	tests := []struct {
		name    string
		args    []string
		stdin   []byte
		code    int
		stdout  string
		stderr  string
		oneLine bool // stderr is one line naming the input
	}{
		{"valid", []string{"inspect", "--roots", roots, good}, nil, 0, "true", "", false},
		{"valid dir", []string{"inspect", h.caDir}, nil, 0, "ca-cert.pem", "", false},
		{"expired", []string{"inspect", "--roots", roots, expired}, nil, 4, "expired at 2026-06-01T11:00:00Z (1h0m ago)", "1 of 1 input(s) invalid", true},
		{"foreign root", []string{"inspect", "--roots", otherRoots, good}, nil, 4, "unknown issuer", "invalid", true},
		{"expires within", []string{"inspect", "--roots", roots, "--expires-within", "1h", soon}, nil, 3, "warning: leaf " + testWorkload + " expires at 2026-06-01T12:30:00Z, in 30m, within 1h", "expire within 1h", true},
		{"expires within days", []string{"inspect", "--roots", roots, "--expires-within", "1d", good}, nil, 3, "within 24h", "", false},
		{"stdin dash", []string{"inspect", "--roots", roots, "-"}, goodPEM, 0, "stdin", "", false},
		{"piped stdin", []string{"inspect", "--roots", roots}, goodPEM, 0, "stdin", "", false},
		{"garbage", []string{"inspect", garbage}, nil, 1, "", "inspect: " + garbage + ": not PEM", true},
		{"truncated", []string{"inspect", truncated}, nil, 1, "", "inspect: " + truncated + ": truncated or corrupt PEM block", true},
		{"unknown block", []string{"inspect", unknown}, nil, 1, "", `inspect: ` + unknown + `: unknown PEM block type "X509 CRL"`, true},
		{"garbage on stdin", []string{"inspect", "-"}, []byte("\x00\x01garbage"), 1, "", "inspect: stdin: not PEM", true},
		{"missing file", []string{"inspect", filepath.Join(h.dir, "nope.pem")}, nil, 1, "", "nope.pem: no such file or directory", true},
		{"bad output", []string{"inspect", "-o", "yaml", good}, nil, 2, "", `invalid argument "yaml" for "-o, --output" flag: unknown output format (want table, json or pem)`, true},
		{"resource without sds", []string{"inspect", "--resource", "default", good}, nil, 2, "", "--resource needs --sds", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := meshidRun(t, bytes.NewReader(tc.stdin), tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			if !strings.Contains(out, tc.stdout) || !strings.Contains(errOut, tc.stderr) {
				t.Fatalf("stdout %q / stderr %q lack %q / %q", out, errOut, tc.stdout, tc.stderr)
			}
			if tc.oneLine && (strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "goroutine")) {
				t.Fatalf("stderr is not one line: %q", errOut)
			}
		})
	}

	// The same certificate, later: expired.
	fake.Set(cliNow.Add(13 * time.Hour))
	if out, _, code := meshidRun(t, nil, "inspect", "--roots", roots, good); code != 4 || !strings.Contains(out, "expired at") {
		t.Fatalf("after expiry: exit %d\n%s", code, out)
	}
}

func TestInspectJSONAndPEM(t *testing.T) {
	fake := withCLIClock(t, cliNow.Add(-48*time.Hour))
	h := newCLIHierarchy(t, fake)
	leafPath := h.writeLeaf(t, "leaf.pem", cliNow.Add(-time.Minute), time.Hour, true)
	roots := filepath.Join(h.rootDir, "root-cert.pem")
	leafPEM, _ := os.ReadFile(leafPath)
	chain, err := certs.ParseCertificates(leafPEM[:bytes.Index(leafPEM, []byte("-----BEGIN PRIVATE KEY"))])
	if err != nil {
		t.Fatal(err)
	}

	out := meshidOK(t, "inspect", "-o", "json", "--roots", roots, leafPath)
	var rep struct {
		SchemaVersion int    `json:"schema_version"`
		Status        string `json:"status"`
		Results       []struct {
			Name            string `json:"name"`
			Type            string `json:"type"`
			Valid           bool   `json:"valid"`
			SPIFFEID        string `json:"spiffe_id"`
			VerifiedAgainst string `json:"verified_against"`
			PrivateKey      *struct {
				Matches *bool `json:"matches"`
			} `json:"private_key"`
			Certificates []struct {
				SHA256Fingerprint string `json:"sha256_fingerprint"`
				AuthorityKeyID    string `json:"authority_key_id"`
				SubjectKeyID      string `json:"subject_key_id"`
				BasicConstraints  *struct {
					CA         bool `json:"ca"`
					MaxPathLen *int `json:"max_path_len"`
				} `json:"basic_constraints"`
			} `json:"certificates"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.SchemaVersion != 1 || rep.Status != "ok" || len(rep.Results) != 1 {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Results[0]
	if r.Type != "Cert Chain" || !r.Valid || r.SPIFFEID != testWorkload || r.VerifiedAgainst != roots ||
		r.PrivateKey == nil || r.PrivateKey.Matches == nil || !*r.PrivateKey.Matches || len(r.Certificates) != 2 {
		t.Fatalf("result %+v", r)
	}
	sum := sha256.Sum256(chain[0].Raw)
	if got := strings.ReplaceAll(r.Certificates[0].SHA256Fingerprint, ":", ""); !strings.EqualFold(got, fmt.Sprintf("%x", sum)) {
		t.Errorf("fingerprint %s, want %x", got, sum)
	}
	if r.Certificates[0].AuthorityKeyID != r.Certificates[1].SubjectKeyID || r.Certificates[0].AuthorityKeyID == "" {
		t.Errorf("leaf AKI %q != intermediate SKI %q", r.Certificates[0].AuthorityKeyID, r.Certificates[1].SubjectKeyID)
	}
	if bc := r.Certificates[1].BasicConstraints; bc == nil || !bc.CA || bc.MaxPathLen == nil || *bc.MaxPathLen != 0 {
		t.Errorf("intermediate basic constraints %+v, want CA pathlen 0", bc)
	}

	out = meshidOK(t, "inspect", "-o", "pem", leafPath)
	if strings.Contains(out, "PRIVATE KEY") {
		t.Fatal("-o pem printed a private key")
	}
	got, err := certs.ParseCertificates([]byte(out))
	if err != nil || len(got) != 2 || !got[0].Equal(chain[0]) || !got[1].Equal(chain[1]) {
		t.Fatalf("-o pem: %v, %d certificates", err, len(got))
	}
}

// runCLIAgent runs the agent assembly for testWorkload, signed in process
// by a CLI-made hierarchy's CA, on the CLI clocks set 48h before cliNow;
// with, if not nil, sets the test's own fields of its Config.
func runCLIAgent(t *testing.T, with func(*agent.Config)) (*agent.Agent, cliHierarchy) {
	t.Helper()
	fake := withCLIClock(t, cliNow.Add(-48*time.Hour))
	h := newCLIHierarchy(t, fake)
	cfg := agent.Config{
		Signer:         testkit.AuthoritySigner{Authority: h.authority(t, fake), Caller: "default/default (test)"},
		Namespace:      "default",
		ServiceAccount: "default",
		TrustDomain:    spiffeid.RequireFromString(testWorkload).TrustDomain(),
		CertTTL:        12 * time.Hour,
		Clock:          fake,
	}
	if with != nil {
		with(&cfg)
	}
	return testkit.RunAgent(t, cfg), h
}

// TestInspectSDS runs the real SDS server and SecretManager (the agent's
// parts) with the CLI-made intermediate as the CA, and inspects what a
// proxy would be served.
func TestInspectSDS(t *testing.T) {
	a, h := runCLIAgent(t, nil)
	sock := a.SocketPath()

	out := meshidOK(t, "inspect", "--sds", sock)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "RESOURCE") || lines[4] != "default: private key (ec-p256, from default) matches" {
		t.Fatalf("want a header, two rows and the key confirmed without -v:\n%s", out)
	}
	for i, want := range [][]string{{"default", "Cert Chain", "true", testWorkload, "12h0m"}, {"ROOTCA", "CA", "true"}} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %d lacks %q: %s", i+1, w, lines[i+1])
			}
		}
	}
	out = meshidOK(t, "inspect", "--sds", sock, "-v")
	if !strings.Contains(out, "Verified against:    ROOTCA") || !strings.Contains(out, "from default, matches") {
		t.Errorf("verbose SDS output does not show the chain verified against ROOTCA with a matching key:\n%s", out)
	}

	out = meshidOK(t, "inspect", "--sds", sock, "--resource", "ROOTCA", "-o", "pem")
	if got, err := certs.ParseCertificates([]byte(out)); err != nil || len(got) != 1 || !got[0].Equal(h.bundle.Roots[0]) {
		t.Fatalf("ROOTCA as PEM: %v\n%s", err, out)
	}

	// A foreign root: default no longer verifies.
	other := filepath.Join(h.dir, "other")
	meshidOK(t, "certs", "root", "--out", other)
	out, _, code := meshidRun(t, nil, "inspect", "--sds", sock, "--roots", filepath.Join(other, "root-cert.pem"))
	if code != inspect.ExitInvalid || !strings.Contains(out, "unknown issuer") {
		t.Fatalf("foreign --roots: exit %d\n%s", code, out)
	}

	// Names the agent cannot serve are answered with its reason (through
	// FetchSecrets), not left to the timeout: the timeout's message would
	// be "no answer for resource".
	for _, tc := range []struct{ name, want string }{
		{"nope", `resource "nope": NotFound: sds: unknown resource "nope"`},
		{"file-cert:certs/a.pem~certs/a-key.pem", `NotFound: sds: unknown resource "file-cert:certs/a.pem~certs/a-key.pem": no such regular file under the agent's --file-secret-dirs (a relative path is relative to the agent's working directory)`},
	} {
		_, errOut, code := meshidRun(t, nil, "inspect", "--sds", sock, "--resource", tc.name, "--timeout", "1m")
		if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Fatalf("resource %s: exit %d, %q; want %q", tc.name, code, errOut, tc.want)
		}
	}
}

func TestInspectNotSDS(t *testing.T) {
	sock := testkit.ServeUnix(t, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) })

	regular := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ sock, want string }{
		{sock, "inspect: SDS " + sock + ": not an SDS server"},
		{regular, "inspect: SDS " + regular + ": not a Unix socket"},
		{filepath.Join(t.TempDir(), "none"), "no such socket"},
	} {
		_, errOut, code := meshidRun(t, nil, "inspect", "--sds", tc.sock)
		if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("--sds %s: exit %d, stderr %q; want one line containing %q", tc.sock, code, errOut, tc.want)
		}
	}
}
