package rootfile_test

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/testkit"
	"github.com/meshid/meshid/sds/rootfile"
)

func roots(t *testing.T, n int) []*x509.Certificate {
	t.Helper()
	out := make([]*x509.Certificate, n)
	for i := range out {
		out[i], _ = testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: fmt.Sprintf("root %d", i)}, TTL: time.Hour})
	}
	return out
}

func write(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A mesh's bundle is read whole: one root, the two of a CA rotation (the
// union the agent pushes while old and new roots are both trusted), and
// DefaultMaxRoots.
func TestReadMeshBundle(t *testing.T) {
	all := roots(t, rootfile.DefaultMaxRoots)
	for _, n := range []int{1, 2, rootfile.DefaultMaxRoots} {
		got, err := rootfile.Read(write(t, certs.EncodeCertificates(all[:n]...)), 0)
		if err != nil {
			t.Fatalf("%d roots: %v", n, err)
		}
		if len(got) != n || !got[n-1].Equal(all[n-1]) {
			t.Fatalf("%d roots: read %d", n, len(got))
		}
	}
}

// The attacker's (or the careless operator's) files: each is refused with
// an error naming the file.
func TestReadRefuses(t *testing.T) {
	all := roots(t, rootfile.DefaultMaxRoots+1)
	big := write(t, bytes.Repeat(certs.EncodeCertificates(all[0]), rootfile.MaxSize/len(certs.EncodeCertificates(all[0]))+1))
	for name, tc := range map[string]struct {
		path, want string
		max        int
	}{
		"one root over the default": {write(t, certs.EncodeCertificates(all...)), "17 certificates, more than the 16 roots", 0},
		"over a configured maximum": {write(t, certs.EncodeCertificates(all[:3]...)), "3 certificates, more than the 2 roots", 2},
		"larger than MaxSize":       {big, "larger than", 0},
		"not PEM":                   {write(t, []byte("not PEM")), "no PEM data", 0},
		"half written":              {write(t, certs.EncodeCertificates(all[0])[:100]), "no PEM data", 0},
		"missing":                   {filepath.Join(t.TempDir(), "absent.pem"), "no such file", 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := rootfile.Read(tc.path, tc.max)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("%v, want an error naming %s and saying %q", err, tc.path, tc.want)
			}
		})
	}
}

// The system CA bundle is refused by name, through a symbolic link, and as
// a copy (by the number of its roots), so that the mesh never trusts the
// public web PKI.
func TestReadRefusesSystemBundle(t *testing.T) {
	sys := ""
	for _, p := range rootfile.SystemBundles {
		if _, err := os.Stat(p); err == nil {
			sys = p
			break
		}
	}
	// By name even where the file is absent (a container without one).
	if _, err := rootfile.Read(rootfile.SystemBundles[0], 0); !errors.Is(err, rootfile.ErrSystemBundle) || !strings.Contains(err.Error(), rootfile.SystemBundles[0]) {
		t.Fatalf("%s: %v, want ErrSystemBundle naming it", rootfile.SystemBundles[0], err)
	}
	if sys == "" {
		testkit.SkipOrFail(t, "no system CA bundle on this machine")
	}
	link := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.Symlink(sys, link); err != nil {
		t.Fatal(err)
	}
	if _, err := rootfile.Read(link, 0); !errors.Is(err, rootfile.ErrSystemBundle) || !strings.Contains(err.Error(), link) || !strings.Contains(err.Error(), sys) {
		t.Fatalf("link to %s: %v, want ErrSystemBundle naming both", sys, err)
	}
	data, err := os.ReadFile(sys)
	if err != nil {
		t.Fatal(err)
	}
	copied := write(t, data)
	if _, err := rootfile.Read(copied, 0); err == nil || !strings.Contains(err.Error(), "a system CA bundle?") {
		t.Fatalf("copy of %s: %v, want too many roots", sys, err)
	}
}

func TestCheck(t *testing.T) {
	all := roots(t, 3)
	if err := rootfile.Check(all, 3); err != nil {
		t.Fatal(err)
	}
	if err := rootfile.Check(all, 2); err == nil {
		t.Fatal("3 roots passed a maximum of 2")
	}
}
