package ca_test

import (
	"bytes"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
)

// checkPEMFastMatchesPEM fails t when the hand-written PEM decoder takes
// data (trimmed) but encoding/pem reads anything else from it than one
// CERTIFICATE REQUEST block of the same bytes and nothing after. It
// reports whether the fast decoder took data.
func checkPEMFastMatchesPEM(t testing.TB, data []byte) bool {
	t.Helper()
	trimmed := bytes.TrimSpace(data)
	der, ok := ca.DecodeCSRPEMFast(trimmed)
	if !ok {
		return false
	}
	block, rest := pem.Decode(trimmed)
	switch {
	case block == nil:
		t.Fatalf("fast decoder took what pem.Decode refuses: %q", data)
	case block.Type != "CERTIFICATE REQUEST" || len(block.Headers) != 0:
		t.Fatalf("pem.Decode reads a %q block with %d headers from %q", block.Type, len(block.Headers), data)
	case len(bytes.TrimSpace(rest)) != 0:
		t.Fatalf("pem.Decode leaves %q after the block of %q", rest, data)
	case !bytes.Equal(block.Bytes, der):
		t.Fatalf("fast decoder reads other bytes than pem.Decode from %q", data)
	}
	return true
}

// TestDecodeCSRPEMFastMatchesPEM: on CSRs of every key type as encoders
// write them (taken by the fast decoder), on other spellings (CRLF,
// headers, spaces, other types, several blocks: left to encoding/pem), and
// on every truncation and bit flip of one, the fast decoder takes an input
// only when pem.Decode reads the same one block from it.
func TestDecodeCSRPEMFastMatchesPEM(t *testing.T) {
	var canonical [][]byte
	for _, kt := range []certs.KeyType{certs.ECP256, certs.ECP384, certs.RSA2048, certs.Ed25519} {
		canonical = append(canonical, istioCSR(t, mustKey(t, kt), callerID.String(), false))
	}
	for _, seed := range fuzzSeeds(t) {
		if b, rest := pem.Decode(seed); b != nil && len(rest) == 0 && b.Type == "CERTIFICATE REQUEST" && len(b.Bytes) > 0 {
			canonical = append(canonical, seed)
		}
	}
	for _, c := range canonical {
		if !checkPEMFastMatchesPEM(t, c) {
			t.Fatalf("the fast decoder does not take a CSR as pem.Encode writes it:\n%s", c)
		}
	}
	c := string(canonical[0])
	body := strings.TrimSuffix(strings.TrimPrefix(c, "-----BEGIN CERTIFICATE REQUEST-----\n"), "-----END CERTIFICATE REQUEST-----\n")
	for name, in := range map[string]string{
		"CRLF":             strings.ReplaceAll(c, "\n", "\r\n"),
		"header":           "-----BEGIN CERTIFICATE REQUEST-----\nProc-Type: 4,ENCRYPTED\n\n" + body + "-----END CERTIFICATE REQUEST-----\n",
		"spaces":           "-----BEGIN CERTIFICATE REQUEST-----\n " + strings.ReplaceAll(body, "\n", " \n") + "-----END CERTIFICATE REQUEST-----\n",
		"NEW CSR":          strings.ReplaceAll(c, "CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST"),
		"certificate":      strings.ReplaceAll(c, "CERTIFICATE REQUEST", "CERTIFICATE"),
		"two blocks":       c + c,
		"trailing data":    c + "x",
		"other END":        strings.Replace(c, "END CERTIFICATE REQUEST", "END CERTIFICATE", 1),
		"empty":            "-----BEGIN CERTIFICATE REQUEST-----\n\n-----END CERTIFICATE REQUEST-----",
		"bad base64":       "-----BEGIN CERTIFICATE REQUEST-----\nA===\n-----END CERTIFICATE REQUEST-----",
		"dash in the body": "-----BEGIN CERTIFICATE REQUEST-----\n" + body[:10] + "-----END CERTIFICATE REQUEST-----\n" + body[10:] + "-----END CERTIFICATE REQUEST-----\n",
	} {
		if checkPEMFastMatchesPEM(t, []byte(in)) {
			t.Errorf("%s: taken by the fast decoder, want it left to encoding/pem", name)
		}
	}
	taken := 0
	for i := range len(c) {
		if checkPEMFastMatchesPEM(t, []byte(c[:i])) {
			taken++
		}
		for bit := range 8 {
			b := []byte(c)
			b[i] ^= 1 << bit
			if checkPEMFastMatchesPEM(t, b) {
				taken++
			}
		}
	}
	if taken == 0 {
		t.Fatal("no mutation taken: the comparison of the bytes never ran")
	}
}

// BenchmarkDecodeCSRPEM compares the fast decoder with pem.Decode on an
// istio-agent CSR.
func BenchmarkDecodeCSRPEM(b *testing.B) {
	p := bytes.TrimSpace(istioCSR(b, mustKey(b, certs.ECP256), callerID.String(), false))
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := ca.DecodeCSRPEMFast(p); !ok {
				b.Fatal("not taken by the fast decoder")
			}
		}
	})
	b.Run("pem", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if blk, _ := pem.Decode(p); blk == nil {
				b.Fatal("not PEM")
			}
		}
	})
}
