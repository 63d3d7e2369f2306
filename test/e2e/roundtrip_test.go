package e2e_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/testkit"
)

var serverServing = regexp.MustCompile(`msg="meshid CA serving".* grpc=(\S+)`)

// The CA hierarchy round trip, through the binaries: `meshid certs root` →
// `meshid certs intermediate` → `meshid server --ca-dir` issues a leaf to
// the Istio client → `meshid inspect` verifies the whole chain; and
// `meshid agent` against that server serves it over SDS.
func TestCertsRoundTrip(t *testing.T) {
	t.Parallel()
	work := testkit.ShortDir(t)
	rootDir := filepath.Join(work, "root")
	westDir := filepath.Join(work, "west")
	mustMeshid(t, "certs", "root", "--out", rootDir)
	mustMeshid(t, "certs", "intermediate", "--root", rootDir, "--out", westDir, "--name", "west")
	rootFile := filepath.Join(rootDir, "root-cert.pem")
	for _, f := range []string{"ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem"} {
		if _, err := os.Stat(filepath.Join(westDir, f)); err != nil {
			t.Fatalf("certs intermediate did not write %s: %v", f, err)
		}
	}

	// The offline JWT issuer stands in for the cluster's API server.
	jwtDir := filepath.Join(work, "jwt")
	issuer, err := devissuer.LoadOrCreate(jwtDir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	token, err := issuer.Mint("payments", "api", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	// The plugged-in CA comes from istiod's environment name.
	srv := startMeshidEnv(t, []string{"ROOT_CA_DIR=" + westDir}, "server",
		"--state-dir", filepath.Join(work, "state"),
		"--listen", "127.0.0.1:0",
		"--monitoring-listen", "127.0.0.1:0",
		"--jwks-file", filepath.Join(jwtDir, devissuer.JWKSFile),
		"--jwt-issuer", "https://meshid.dev.local",
	)
	addr := srv.waitLine(t, serverServing)[1]
	id := mustID(t, "payments", "api")

	t.Run("server issues under the intermediate", func(t *testing.T) {
		c := istioClient(t, addr, "", rootFile)
		key, csr := istioCSR(t, id)
		resp, err := createCertificate(t, c, csr, token)
		if err != nil {
			t.Fatalf("CreateCertificate: %v", err)
		}
		if n := len(resp.GetCertChain()); n != 3 {
			t.Fatalf("cert_chain has %d elements, want leaf, intermediate, root", n)
		}
		leaf, inter := verifyIstioChain(t, resp.GetCertChain(), rootFile, key, id)
		caCert, err := os.ReadFile(filepath.Join(westDir, "ca-cert.pem"))
		if err != nil {
			t.Fatal(err)
		}
		if !sameCerts(inter, parseCerts(t, caCert)) {
			t.Fatal("the intermediate in cert_chain is not west/ca-cert.pem")
		}
		if !slices.Equal(inter[0].Subject.Locality, []string{"west"}) || !inter[0].IsCA || inter[0].MaxPathLen != 0 || !inter[0].MaxPathLenZero {
			t.Fatalf("intermediate: L=%v CA=%v pathlen=%d", inter[0].Subject.Locality, inter[0].IsCA, inter[0].MaxPathLen)
		}

		// The leaf, its chain and its key, as a workload would keep them.
		chainFile := writePEM(t, work, "chain.pem", leaf, inter[0])
		keyPEM, err := certs.EncodePrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		keyFile := filepath.Join(work, "key.pem")
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}

		res := mustMeshid(t, "inspect", "--roots", rootFile, chainFile)
		row := tableRows(t, res.stdout)[chainFile]
		if row == nil || !strings.Contains(strings.Join(row, " "), " true "+id.String()+" ") {
			t.Fatalf("inspect does not show the chain as valid for %s:\n%s", id, res.stdout)
		}
		rep := parseReport(t, mustMeshid(t, "inspect", "--roots", rootFile, chainFile, keyFile, "-o", "json"))
		// One row for the chain, which the key is paired with, one for the key.
		if !rep.Valid || len(rep.Results) != 2 || rep.Results[0].Name != chainFile {
			t.Fatalf("report %+v", rep)
		}
		r := rep.Results[0]
		if !r.Valid || r.SPIFFEID != id.String() || r.VerifiedAgainst == "" || r.PrivateKey == nil || r.PrivateKey.Matches == nil || !*r.PrivateKey.Matches {
			t.Fatalf("result %+v", r)
		}

		// The same leaf is foreign to another root.
		other := filepath.Join(work, "other")
		mustMeshid(t, "certs", "root", "--out", other)
		bad := runMeshid(t, nil, "inspect", "--roots", filepath.Join(other, "root-cert.pem"), chainFile)
		if bad.code != 4 || !strings.Contains(bad.stdout, "unknown issuer") {
			t.Fatalf("against another root: exit %d\n%s%s", bad.code, bad.stdout, bad.stderr)
		}
	})

	t.Run("inspect the cacerts directory", func(t *testing.T) {
		res := mustMeshid(t, "inspect", "--roots", rootFile, westDir)
		if strings.Contains(res.stdout, " false ") {
			t.Fatalf("something in %s is invalid:\n%s", westDir, res.stdout)
		}
	})

	t.Run("agent", func(t *testing.T) {
		tokenFile := filepath.Join(work, "istio-token")
		if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(work, "run", "sds.sock")
		// The agent verifies the CA's serving certificate, which the
		// intermediate signed, against the mesh root. The CA and its root
		// come from istio-agent's environment names.
		startMeshidEnv(t, []string{"CA_ADDR=" + addr, "CA_ROOT_CA=" + rootFile}, "agent",
			"--token-file", tokenFile,
			"--sds-socket", sock,
			"--monitoring-listen", "127.0.0.1:0",
		)
		waitSDS(t, sock)

		got := openSotw(t, sdsClient(t, sock), "default", "ROOTCA").recvNames("default", "ROOTCA")
		svid := svidOf(t, got["default"])
		if len(svid.Certificates) != 2 || !sameCerts(svid.Certificates[1:], parseCerts(t, mustRead(t, filepath.Join(westDir, "ca-cert.pem")))) {
			t.Fatalf("default carries %d certificates, want the leaf and the west intermediate", len(svid.Certificates))
		}
		bundle := bundleOf(t, got["ROOTCA"])
		if !sameCerts(bundle.X509Authorities(), parseCerts(t, mustRead(t, rootFile))) {
			t.Fatal("ROOTCA is not the mesh root")
		}
		verifySVID(t, svid, bundle, time.Time{}, id)

		rep := parseReport(t, mustMeshid(t, "inspect", "--sds", sock, "-o", "json"))
		if !rep.Valid || len(rep.Results) != 2 {
			t.Fatalf("report %+v", rep)
		}
		for _, r := range rep.Results {
			if !r.Valid || r.NotAfter == nil || r.Name == "default" && r.SPIFFEID != id.String() {
				t.Fatalf("result %+v", r)
			}
		}
	})
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
