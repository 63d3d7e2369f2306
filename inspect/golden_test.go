package inspect_test

// Golden files hold the exact table, verbose and JSON output for
// certificates created at run time. They are stable because the clock is
// fixed (now) and testing/cryptotest makes every key, serial and ECDSA
// signature deterministic for a seed, so serials, fingerprints and key IDs
// repeat byte for byte. Should a Go release change how keys are derived
// from the random stream, regenerate with
//
//	go test ./inspect -run Golden -update
//
// and check that only serials, fingerprints and key IDs moved.

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/cryptotest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/inspect"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the current output")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (run with -update if the change is intended)\n--- got ---\n%s\n--- want ---\n%s", path, got, want)
	}
}

func mustParse(t *testing.T, name string, data ...[]byte) *inspect.Input {
	t.Helper()
	in, err := inspect.ParsePEM(name, bytes.Join(data, nil))
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func encodeKey(t *testing.T, m mesh) []byte {
	t.Helper()
	b, err := certs.EncodePrivateKey(m.leafKey)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// workloadCSR returns a DER CSR for the workload ID with the leaf's key.
func workloadCSR(t *testing.T, m mesh) []byte {
	t.Helper()
	csr, err := certs.NewCSR(m.leafKey, mustID(t, workload))
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func mustID(t *testing.T, s string) spiffeid.ID {
	t.Helper()
	id, err := spiffeid.FromString(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func renderAll(t *testing.T, name string, rep *inspect.Report) {
	t.Helper()
	var table, verbose, js bytes.Buffer
	if err := inspect.WriteTable(&table, rep, false); err != nil {
		t.Fatal(err)
	}
	if err := inspect.WriteTable(&verbose, rep, true); err != nil {
		t.Fatal(err)
	}
	if err := inspect.WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, name+".table", table.Bytes())
	golden(t, name+".verbose", verbose.Bytes())
	golden(t, name+".json", js.Bytes())
}

// TestGoldenSDS is what `meshid inspect --sds` shows for a healthy agent.
func TestGoldenSDS(t *testing.T) {
	cryptotest.SetGlobalRandom(t, 1)
	m := newMesh(t)
	def := &inspect.Input{
		Name: "default", Origin: inspect.OriginSDS,
		Certs: []*x509.Certificate{m.leaf, m.inter.cert}, Key: m.leafKey,
		Roots: []*x509.Certificate{m.root.cert}, RootsName: "ROOTCA",
	}
	rootca := &inspect.Input{Name: "ROOTCA", Origin: inspect.OriginSDS, Certs: []*x509.Certificate{m.root.cert}, Bundle: true}
	rep := inspect.Check([]*inspect.Input{def, rootca}, inspect.Options{Now: now})
	if rep.Status != inspect.StatusOK {
		t.Fatalf("status %s, want ok: %+v", rep.Status, rep.Results)
	}
	renderAll(t, "sds", rep)
}

// TestGoldenProblems covers one file per kind of failure, as files given
// on the command line with --roots and --expires-within.
func TestGoldenProblems(t *testing.T) {
	cryptotest.SetGlobalRandom(t, 2)
	m := newMesh(t)
	inter := certs.EncodeCertificates(m.inter.cert)
	foreignRoot := newRoot(t, m.root.cert.Subject, now.Add(-time.Hour), 24*time.Hour)
	foreign, _ := foreignRoot.leaf(t, workload, now.Add(-time.Minute), time.Hour, nil)
	expired, _ := m.inter.leaf(t, workload, now.Add(-25*time.Hour), 24*time.Hour, nil)
	future, _ := m.inter.leaf(t, workload, now.Add(time.Hour), 24*time.Hour, nil)
	soon, _ := m.inter.leaf(t, workload, now.Add(-time.Hour), 90*time.Minute, nil)
	web, _ := m.inter.leaf(t, "", now.Add(-time.Hour), 24*time.Hour, func(c *x509.Certificate) {
		c.Subject = pkix.Name{CommonName: "www.example.com"}
		c.DNSNames = []string{"www.example.com"}
	})
	csrDER := workloadCSR(t, m)
	inputs := []*inspect.Input{
		mustParse(t, "expired.pem", certs.EncodeCertificates(expired), inter),
		mustParse(t, "future.pem", certs.EncodeCertificates(future), inter),
		mustParse(t, "foreign.pem", certs.EncodeCertificates(foreign)),
		mustParse(t, "web.pem", certs.EncodeCertificates(web), inter),
		mustParse(t, "mismatch.pem", certs.EncodeCertificates(soon), inter, encodeKey(t, m)),
		mustParse(t, "workload.csr", certs.EncodeCSR(csrDER)),
	}
	rep := inspect.Check(inputs, inspect.Options{
		Now:           now,
		Roots:         []*x509.Certificate{m.root.cert},
		RootsName:     "roots.pem",
		ExpiresWithin: time.Hour,
	})
	if rep.Status != inspect.StatusInvalid || rep.Valid {
		t.Fatalf("status %s valid %t, want invalid", rep.Status, rep.Valid)
	}
	renderAll(t, "problems", rep)
	var table bytes.Buffer
	if err := inspect.WriteTable(&table, rep, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"expired at", "not yet valid", "unknown issuer", "not a SPIFFE leaf", "does not match", "warning: "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}
