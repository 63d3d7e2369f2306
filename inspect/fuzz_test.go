package inspect_test

import (
	"bytes"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/inspect"
)

// FuzzParsePEM feeds arbitrary files to `meshid inspect`'s parser and
// checker. Properties:
//   - it never panics, and Check and every renderer accept what ParsePEM
//     accepts;
//   - an error is one line that names the input and never holds the
//     private key's PEM body;
//   - accepted input holds something (certificates, a CSR or a key), never
//     both certificates and a CSR, and Bundle is set only for self-signed
//     CAs;
//   - what WritePEM prints parses back to the same certificates and CSR.
func FuzzParsePEM(f *testing.F) {
	m := newMesh(f)
	keyPEM, err := certs.EncodePrivateKey(m.leafKey)
	if err != nil {
		f.Fatal(err)
	}
	csr, err := certs.NewCSR(m.leafKey, spiffeid.RequireFromString(workload))
	if err != nil {
		f.Fatal(err)
	}
	leaf := certs.EncodeCertificates(m.leaf)
	chain := certs.EncodeCertificates(m.leaf, m.inter.cert)
	roots := certs.EncodeCertificates(m.root.cert)
	join := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, s := range [][]byte{
		chain, roots, keyPEM, certs.EncodeCSR(csr),
		join(chain, keyPEM),
		join([]byte("explanatory text\n"), leaf),
		join(certs.EncodeCertificates(m.inter.cert), roots),
		m.leaf.Raw, // DER
		join(leaf, certs.EncodeCSR(csr)),
		join(keyPEM, keyPEM),
		chain[:len(chain)-40],
		join(leaf, []byte("junk")),
		pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}}),
		pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}),
		pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1}}),
		[]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"),
		[]byte(" \n"), {},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.pem"
		in, err := inspect.ParsePEM(name, data)
		if err != nil {
			msg := err.Error()
			if in != nil || !strings.HasPrefix(msg, "inspect: "+name+": ") || strings.Contains(msg, "\n") {
				t.Fatalf("error %q (input %v): want one line naming %s", msg, in != nil, name)
			}
			for _, body := range pemBodyLines(data, "PRIVATE KEY") {
				if strings.Contains(msg, body) {
					t.Fatalf("error %q holds private key material", msg)
				}
			}
			return
		}
		if len(in.Certs) == 0 && in.CSR == nil && in.Key == nil {
			t.Fatal("accepted an input that holds nothing")
		}
		if len(in.Certs) != 0 && in.CSR != nil {
			t.Fatal("accepted certificates and a CSR together")
		}
		for _, c := range in.Certs {
			if in.Bundle && (!c.IsCA || !bytes.Equal(c.RawIssuer, c.RawSubject)) {
				t.Fatalf("bundle holds %q, not a self-signed CA", c.Subject)
			}
		}

		rep := inspect.Check([]*inspect.Input{in}, inspect.Options{Now: now})
		if len(rep.Results) != 1 || rep.Valid != (rep.Status != inspect.StatusInvalid) {
			t.Fatalf("report: %d results, valid=%v status=%v", len(rep.Results), rep.Valid, rep.Status)
		}
		var out bytes.Buffer
		for _, render := range []func() error{
			func() error { return inspect.WriteTable(&out, rep, true) },
			func() error { return inspect.WriteJSON(&out, rep) },
		} {
			if err := render(); err != nil {
				t.Fatal(err)
			}
		}
		if in.Key != nil {
			for _, body := range pemBodyLines(data, "PRIVATE KEY") {
				if bytes.Contains(out.Bytes(), []byte(body)) {
					t.Fatal("the report holds private key material")
				}
			}
		}

		out.Reset()
		if err := inspect.WritePEM(&out, []*inspect.Input{in}); err != nil {
			t.Fatal(err)
		}
		if len(in.Certs) == 0 && in.CSR == nil {
			if out.Len() != 0 {
				t.Fatal("WritePEM wrote a key")
			}
			return // a key on its own: never written
		}
		back, err := inspect.ParsePEM(name, out.Bytes())
		if err != nil {
			t.Fatalf("WritePEM output does not parse: %v", err)
		}
		if len(back.Certs) != len(in.Certs) || (back.CSR == nil) != (in.CSR == nil) {
			t.Fatalf("round trip: %d certs (csr %v), want %d (csr %v)", len(back.Certs), back.CSR != nil, len(in.Certs), in.CSR != nil)
		}
		for i := range in.Certs {
			if !back.Certs[i].Equal(in.Certs[i]) {
				t.Fatalf("round trip changed certificate %d", i)
			}
		}
		if in.CSR != nil && !bytes.Equal(back.CSR.Raw, in.CSR.Raw) {
			t.Fatal("round trip changed the CSR")
		}
		if back.Bundle != in.Bundle {
			t.Fatalf("round trip: bundle %v, want %v", back.Bundle, in.Bundle)
		}
	})
}

// pemBodyLines returns the base64 lines (16 characters or more) of the PEM
// blocks in data whose type contains typ.
func pemBodyLines(data []byte, typ string) []string {
	var out []string
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out
		}
		if !strings.Contains(b.Type, typ) {
			continue
		}
		for _, l := range strings.Split(string(pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: b.Bytes})), "\n") {
			if len(l) >= 16 && !strings.HasPrefix(l, "-----") {
				out = append(out, l)
			}
		}
	}
}
