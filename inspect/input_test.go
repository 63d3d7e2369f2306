package inspect_test

import (
	"bytes"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/inspect"
)

func TestParsePEMErrors(t *testing.T) {
	m := newMesh(t)
	cert := certs.EncodeCertificates(m.leaf)
	key, csr := encodeKey(t, m), workloadCSR(t, m)
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", []byte("  \n"), "empty input"},
		{"garbage", []byte("hello, world\x00\x01"), "not PEM"},
		{"truncated", cert[:len(cert)/2], "truncated or corrupt PEM block after 0 good block(s)"},
		{"truncated second block", append(append([]byte{}, cert...), cert[:len(cert)-30]...), "truncated or corrupt PEM block after 1 good block(s)"},
		{"unknown block", pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: []byte{1}}), `unknown PEM block type "X509 CRL" (block 1)`},
		{"trailing data", append(append([]byte{}, cert...), "junk"...), "unexpected data after the last PEM block"},
		{"bad certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}), "PEM block 1: malformed certificate"},
		{"encrypted key", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), "encrypted private keys are not supported"},
		{"headers", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1}}), "has headers"},
		{"bad key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}), "private key is malformed"},
		{"two keys", append(append([]byte{}, key...), key...), "more than one private key"},
		{"cert and CSR", append(append([]byte{}, cert...), certs.EncodeCSR(csr)...), "both certificates and a CSR"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := inspect.ParsePEM("in.pem", tc.data)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "inspect: in.pem: ") || !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q, want one line naming in.pem and containing %q", msg, tc.want)
			}
		})
	}
	if _, err := inspect.ParsePEM("-", []byte("x")); err == nil || !strings.HasPrefix(err.Error(), "inspect: stdin: ") {
		t.Fatalf("stdin error = %v, want it to name stdin", err)
	}
}

func TestParsePEMContents(t *testing.T) {
	m := newMesh(t)
	key, csr := encodeKey(t, m), workloadCSR(t, m)
	tests := []struct {
		name    string
		data    []byte
		typ     inspect.Type
		n       int
		bundle  bool
		withKey bool
	}{
		{"chain with key and text", bytes.Join([][]byte{[]byte("Certificate:\n  explanatory text\n"), certs.EncodeCertificates(m.leaf, m.inter.cert), key}, nil), inspect.TypeChain, 2, false, true},
		{"DER certificate", m.leaf.Raw, inspect.TypeChain, 1, false, false},
		{"root bundle", certs.EncodeCertificates(m.root.cert), inspect.TypeCA, 1, true, false},
		{"intermediate chain", certs.EncodeCertificates(m.inter.cert, m.root.cert), inspect.TypeCA, 2, false, false},
		{"key", key, inspect.TypeKey, 0, false, true},
		{"csr", certs.EncodeCSR(csr), inspect.TypeCSR, 0, false, false},
		{"ec parameters then key", append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}}), key...), inspect.TypeKey, 0, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, err := inspect.ParsePEM("in.pem", tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if in.Type() != tc.typ || len(in.Certs) != tc.n || in.Bundle != tc.bundle || (in.Key != nil) != tc.withKey {
				t.Fatalf("got type %s, %d certs, bundle %t, key %t", in.Type(), len(in.Certs), in.Bundle, in.Key != nil)
			}
		})
	}
}

func write(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDir(t *testing.T) {
	m := newMesh(t)
	interKey, _ := certs.EncodePrivateKey(m.inter.key)
	rootKey, _ := certs.EncodePrivateKey(m.root.key)

	cacerts := t.TempDir()
	write(t, cacerts, "ca-cert.pem", certs.EncodeCertificates(m.inter.cert))
	write(t, cacerts, "ca-key.pem", interKey)
	write(t, cacerts, "cert-chain.pem", certs.EncodeCertificates(m.inter.cert, m.root.cert))
	write(t, cacerts, "root-cert.pem", certs.EncodeCertificates(m.root.cert))

	tlsDir := t.TempDir()
	leafKey, _ := certs.EncodePrivateKey(m.leafKey)
	write(t, tlsDir, "tls.crt", certs.EncodeCertificates(m.leaf, m.inter.cert))
	write(t, tlsDir, "tls.key", leafKey)
	write(t, tlsDir, "ca.crt", certs.EncodeCertificates(m.root.cert))

	rootDir := t.TempDir()
	write(t, rootDir, "root-cert.pem", certs.EncodeCertificates(m.root.cert))
	write(t, rootDir, "root-key.pem", rootKey)

	badKey := t.TempDir()
	write(t, badKey, "ca-cert.pem", certs.EncodeCertificates(m.inter.cert))
	write(t, badKey, "ca-key.pem", rootKey)
	write(t, badKey, "root-cert.pem", certs.EncodeCertificates(m.root.cert))

	tests := []struct {
		name  string
		dir   string
		types []inspect.Type
		valid bool
	}{
		{"cacerts", cacerts, []inspect.Type{inspect.TypeCA, inspect.TypeCA}, true},
		{"tls", tlsDir, []inspect.Type{inspect.TypeChain, inspect.TypeCA}, true},
		{"root", rootDir, []inspect.Type{inspect.TypeCA}, true},
		{"key mismatch", badKey, []inspect.Type{inspect.TypeCA, inspect.TypeCA}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ins, err := inspect.Load(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			var types []inspect.Type
			for _, in := range ins {
				types = append(types, in.Type())
			}
			if len(types) != len(tc.types) {
				t.Fatalf("types %v, want %v", types, tc.types)
			}
			for i := range types {
				if types[i] != tc.types[i] {
					t.Fatalf("types %v, want %v", types, tc.types)
				}
			}
			rep := inspect.Check(ins, inspect.Options{Now: now})
			if rep.Valid != tc.valid {
				t.Fatalf("valid = %t, want %t: %+v", rep.Valid, tc.valid, rep.Results)
			}
			if tc.valid && len(ins[0].Certs) != 0 && ins[0].Roots != nil && rep.Results[0].VerifiedAgainst == "" {
				t.Fatalf("%s not verified against the directory's roots", ins[0].Name)
			}
		})
	}

	empty := t.TempDir()
	if _, err := inspect.Load(empty); err == nil || !strings.Contains(err.Error(), "not a CA directory") {
		t.Fatalf("empty dir: err = %v", err)
	}
	if _, err := inspect.Load(filepath.Join(empty, "nope.pem")); err == nil || !strings.Contains(err.Error(), "nope.pem: no such file") {
		t.Fatalf("missing file: err = %v", err)
	}
}
