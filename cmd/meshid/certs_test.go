package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/catool"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/testkit"
)

// cliNow is the fixed time of the certs and inspect command tests.
var cliNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// withCLIClock sets the clocks of `meshid certs` and `meshid inspect` to
// a fake clock at t for the duration of the test.
func withCLIClock(tb testing.TB, t time.Time) *clock.Fake {
	tb.Helper()
	fake := clock.NewFake(t)
	oldCerts, oldInspect := certsClock, inspectClock
	certsClock, inspectClock = fake, fake
	tb.Cleanup(func() { certsClock, inspectClock = oldCerts, oldInspect })
	return fake
}

// meshidRun runs the command line as main does and returns what it wrote
// and its exit code; main's "meshid: <error>" line goes to stderr.
func meshidRun(t *testing.T, stdin io.Reader, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := newRootCmd(&out, &errb)
	cmd.SetArgs(args)
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	cmd.SetIn(stdin)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		errb.WriteString("meshid: " + err.Error() + "\n")
		return out.String(), errb.String(), cli.ExitCode(err)
	}
	return out.String(), errb.String(), 0
}

func meshidOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := meshidRun(t, nil, args...)
	if code != 0 {
		t.Fatalf("meshid %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func TestCertsRootAndIntermediate(t *testing.T) {
	withCLIClock(t, cliNow)
	dir := t.TempDir()
	rootDir, west := filepath.Join(dir, "root"), filepath.Join(dir, "west")
	out := meshidOK(t, "certs", "root", "--out", rootDir, "--key-type", "ec-p384", "--org", "Acme", "--cn", "Acme Root")
	if !strings.Contains(out, "root-key.pem") {
		t.Errorf("root output does not list the key: %s", out)
	}
	root := testkit.ReadCerts(t, filepath.Join(rootDir, "root-cert.pem"))[0]
	if m := testkit.FilePerm(t, filepath.Join(rootDir, "root-key.pem")); m != 0o600 {
		t.Errorf("root-key.pem mode %o, want 600", m)
	}
	if !root.IsCA || !root.BasicConstraintsValid || root.MaxPathLen != -1 ||
		root.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("root: CA %t, pathlen %d, key usage %b", root.IsCA, root.MaxPathLen, root.KeyUsage)
	}
	if root.Subject.String() != "CN=Acme Root,O=Acme" || !root.NotBefore.Equal(cliNow.Add(-catool.Backdate)) || !root.NotAfter.Equal(cliNow.Add(-catool.Backdate+87600*time.Hour)) {
		t.Errorf("root: subject %q, valid %v to %v", root.Subject, root.NotBefore, root.NotAfter)
	}
	if pub, ok := root.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P384() {
		t.Errorf("root key %s, want ec-p384", certs.KeyTypeOf(root.PublicKey))
	}

	meshidOK(t, "certs", "intermediate", "--root", rootDir, "--out", west, "--name", "west")
	inter := testkit.ReadCerts(t, filepath.Join(west, "ca-cert.pem"))[0]
	if !inter.IsCA || inter.MaxPathLen != 0 || !inter.MaxPathLenZero {
		t.Errorf("intermediate: CA %t, pathlen %d (zero %t), want CA with pathlen 0", inter.IsCA, inter.MaxPathLen, inter.MaxPathLenZero)
	}
	if inter.Subject.String() != "CN=Intermediate CA,O=Acme,L=west" {
		t.Errorf("intermediate subject %q", inter.Subject)
	}
	if !inter.NotAfter.Equal(root.NotAfter) {
		t.Errorf("default intermediate lifetime ends %v, want the root's end %v", inter.NotAfter, root.NotAfter)
	}
	if err := inter.CheckSignatureFrom(root); err != nil {
		t.Errorf("intermediate not signed by the root: %v", err)
	}
	chain := testkit.ReadCerts(t, filepath.Join(west, "cert-chain.pem"))
	if len(chain) != 2 || !chain[0].Equal(inter) || !chain[1].Equal(root) {
		t.Errorf("cert-chain.pem holds %d certificates, want the intermediate then the root", len(chain))
	}
	if rs := testkit.ReadCerts(t, filepath.Join(west, "root-cert.pem")); len(rs) != 1 || !rs[0].Equal(root) {
		t.Error("root-cert.pem is not the root")
	}
	if m := testkit.FilePerm(t, filepath.Join(west, "ca-key.pem")); m != 0o600 {
		t.Errorf("ca-key.pem mode %o, want 600", m)
	}
	// What `meshid server --ca-dir` loads.
	b, err := keystore.LoadDir(west, cliNow)
	if err != nil {
		t.Fatalf("keystore.LoadDir: %v", err)
	}
	if !b.Cert.Equal(inter) || len(b.Roots) != 1 || !b.Roots[0].Equal(root) {
		t.Fatalf("bundle: cert %q, %d roots", b.Cert.Subject, len(b.Roots))
	}
	if err := b.Validate(cliNow); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestCertsKeyTypes(t *testing.T) {
	withCLIClock(t, cliNow)
	tests := []struct {
		keyType string
		ok      bool
		check   func(any) bool
	}{
		{"ec-p256", true, func(k any) bool { p, ok := k.(*ecdsa.PublicKey); return ok && p.Curve == elliptic.P256() }},
		{"rsa-2048", true, func(k any) bool { p, ok := k.(*rsa.PublicKey); return ok && p.N.BitLen() == 2048 }},
		{"ed25519", false, nil},
		{"dsa", false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.keyType, func(t *testing.T) {
			dir := t.TempDir()
			_, errOut, code := meshidRun(t, nil, "certs", "root", "--out", dir, "--key-type", tc.keyType)
			if (code == 0) != tc.ok {
				t.Fatalf("exit %d, want ok=%t: %s", code, tc.ok, errOut)
			}
			if !tc.ok {
				if !strings.Contains(errOut, "--key-type") {
					t.Fatalf("error %q does not name --key-type", errOut)
				}
				return
			}
			if c := testkit.ReadCerts(t, filepath.Join(dir, "root-cert.pem"))[0]; !tc.check(c.PublicKey) {
				t.Fatalf("key %s", certs.KeyTypeOf(c.PublicKey))
			}
		})
	}
}

func TestCertsRefusals(t *testing.T) {
	fake := withCLIClock(t, cliNow)
	dir := t.TempDir()
	rootDir, west := filepath.Join(dir, "root"), filepath.Join(dir, "west")
	meshidOK(t, "certs", "root", "--out", rootDir, "--ttl", "8760h")
	meshidOK(t, "certs", "intermediate", "--root", rootDir, "--out", west, "--name", "west", "--ttl", "720h")
	rootKey, _ := os.ReadFile(filepath.Join(rootDir, "root-key.pem"))
	caKey, _ := os.ReadFile(filepath.Join(west, "ca-key.pem"))

	otherRoot := filepath.Join(dir, "other")
	meshidOK(t, "certs", "root", "--out", otherRoot)
	mismatched := filepath.Join(dir, "mismatched")
	if err := os.MkdirAll(mismatched, 0o700); err != nil {
		t.Fatal(err)
	}
	copyPEMFile(t, filepath.Join(rootDir, "root-cert.pem"), filepath.Join(mismatched, "root-cert.pem"))
	copyPEMFile(t, filepath.Join(otherRoot, "root-key.pem"), filepath.Join(mismatched, "root-key.pem"))

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"root key exists", []string{"certs", "root", "--out", rootDir}, "root-key.pem exists; refusing to overwrite a CA key without --force"},
		{"intermediate key exists", []string{"certs", "intermediate", "--root", rootDir, "--out", west, "--name", "west"}, "ca-key.pem exists"},
		{"outlives the root", []string{"certs", "intermediate", "--root", rootDir, "--out", filepath.Join(dir, "long"), "--name", "long", "--ttl", "8761h"},
			"after the root expires at 2027-06-01T11:55:00Z; shorten --ttl or pass --allow-outlive"},
		{"no root dir", []string{"certs", "intermediate", "--root", filepath.Join(dir, "nope"), "--out", filepath.Join(dir, "x"), "--name", "x"}, "no such file or directory"},
		{"key of another root", []string{"certs", "intermediate", "--root", mismatched, "--out", filepath.Join(dir, "x"), "--name", "x"}, "does not belong to any certificate"},
		{"bad cluster name", []string{"certs", "intermediate", "--root", rootDir, "--out", filepath.Join(dir, "x"), "--name", "a/b"}, `--name "a/b"`},
		{"missing --name", []string{"certs", "intermediate", "--root", rootDir, "--out", filepath.Join(dir, "x")}, `required flag(s) "name" not set`},
		{"missing --out", []string{"certs", "root"}, `required flag(s) "out" not set`},
		{"zero ttl", []string{"certs", "root", "--out", filepath.Join(dir, "z"), "--ttl", "0s"}, "--ttl must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := meshidRun(t, nil, tc.args...)
			if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Fatalf("exit %d, stderr %q; want a one-line failure containing %q", code, errOut, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(rootDir, "root-key.pem")); !bytes.Equal(b, rootKey) {
		t.Fatal("root-key.pem changed without --force")
	}
	if b, _ := os.ReadFile(filepath.Join(west, "ca-key.pem")); !bytes.Equal(b, caKey) {
		t.Fatal("ca-key.pem changed without --force")
	}

	// --force replaces; --allow-outlive allows what was asked for.
	meshidOK(t, "certs", "intermediate", "--root", rootDir, "--out", west, "--name", "west", "--force")
	if b, _ := os.ReadFile(filepath.Join(west, "ca-key.pem")); bytes.Equal(b, caKey) {
		t.Fatal("ca-key.pem not replaced with --force")
	}
	long := filepath.Join(dir, "long")
	meshidOK(t, "certs", "intermediate", "--root", rootDir, "--out", long, "--name", "long", "--ttl", "8761h", "--allow-outlive")
	if c := testkit.ReadCerts(t, filepath.Join(long, "ca-cert.pem"))[0]; !c.NotAfter.Equal(cliNow.Add(-catool.Backdate + 8761*time.Hour)) {
		t.Fatalf("--allow-outlive: NotAfter %v, want %v", c.NotAfter, cliNow.Add(-catool.Backdate+8761*time.Hour))
	}

	// An expired root signs nothing.
	fake.Set(cliNow.Add(8761 * time.Hour))
	_, errOut, code := meshidRun(t, nil, "certs", "intermediate", "--root", rootDir, "--out", filepath.Join(dir, "late"), "--name", "late")
	if code == 0 || !strings.Contains(errOut, "the root expired at 2027-06-01T11:55:00Z") {
		t.Fatalf("expired root: exit %d, %q", code, errOut)
	}
}

func copyPEMFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestCertsMakefile runs certs/Makefile's Istio-style targets with a meshid
// built from this package.
func TestCertsMakefile(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Fatalf("make is needed for certs/Makefile: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "meshid")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	makefile, err := filepath.Abs("../../certs/Makefile")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	runMake := func(targets ...string) string {
		t.Helper()
		cmd := exec.Command(makeBin, append([]string{"-f", makefile, "MESHID=" + bin, "KEY_TYPE=ec-p384"}, targets...)...)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %v: %v\n%s", targets, err, out)
		}
		return string(out)
	}
	runMake("root-ca")
	runMake("west-cacerts", "east-cacerts")
	root := testkit.ReadCerts(t, filepath.Join(work, "root-cert.pem"))[0]
	for _, cluster := range []string{"west", "east"} {
		b, err := keystore.LoadDir(filepath.Join(work, cluster), time.Now())
		if err != nil {
			t.Fatalf("%s: %v", cluster, err)
		}
		if b.Cert.Subject.Locality[0] != cluster || !b.Roots[0].Equal(root) || certs.KeyTypeOf(b.Cert.PublicKey) != "ec-p384" {
			t.Fatalf("%s: subject %q, key %s", cluster, b.Cert.Subject, certs.KeyTypeOf(b.Cert.PublicKey))
		}
	}
	key, _ := os.ReadFile(filepath.Join(work, "west", "ca-key.pem"))
	if out := runMake("west-cacerts"); strings.Contains(out, "certs intermediate") {
		t.Fatalf("second make regenerated the intermediate:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(work, "west", "ca-key.pem")); !bytes.Equal(b, key) {
		t.Fatal("second make replaced ca-key.pem")
	}
}

// TestCertsWorkDirIgnored: the working directory certs/Makefile suggests
// holds CA keys and is ignored by git, at the top and under certs/.
func TestCertsWorkDirIgnored(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		testkit.SkipOrFail(t, "no git")
	}
	for _, p := range []string{"work/root-key.pem", "certs/work/west/ca-key.pem"} {
		cmd := exec.Command("git", "check-ignore", "-q", "--no-index", p)
		cmd.Dir = "../.."
		if err := cmd.Run(); err != nil {
			t.Errorf("%s is not ignored by git: %v", p, err)
		}
	}
}
