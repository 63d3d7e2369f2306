package inspect

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/meshid/meshid/certs"
)

// Type is what an input holds, as shown in the TYPE column.
type Type string

// Input types.
const (
	TypeChain Type = "Cert Chain" // a leaf (not a CA) followed by its intermediates
	TypeCA    Type = "CA"         // CA certificates: a trust bundle or a signing CA's chain
	TypeKey   Type = "Key"        // a private key on its own
	TypeCSR   Type = "CSR"        // a certificate signing request
)

// Origin says where an input came from.
type Origin string

// Input origins.
const (
	OriginFile  Origin = "file"
	OriginStdin Origin = "stdin"
	OriginSDS   Origin = "sds"
)

// Input is one thing to inspect: a file, a file of a CA directory, or an
// SDS resource.
type Input struct {
	Name   string // file path, "-" for stdin, or the SDS resource name
	Origin Origin

	// Certs is a chain (leaf first) or, when Bundle is set, a set of trust
	// anchors that are checked one by one.
	Certs  []*x509.Certificate
	Bundle bool

	Key     crypto.Signer // private key for Certs[0] or CSR, if known
	KeyName string        // where Key came from when not Name itself

	CSR *x509.CertificateRequest

	// Roots, when set, are the trust anchors this input belongs with (the
	// root-cert.pem of its CA directory, or ROOTCA for an SDS certificate).
	// Options.Roots takes precedence.
	Roots     []*x509.Certificate
	RootsName string
}

// Type reports what the input holds.
func (in *Input) Type() Type {
	switch {
	case in.CSR != nil:
		return TypeCSR
	case len(in.Certs) == 0:
		return TypeKey
	case in.Bundle || in.Certs[0].IsCA:
		return TypeCA
	}
	return TypeChain
}

// ParsePEM parses data holding certificates, at most one private key and
// at most one CSR. Text before a PEM block is allowed (RFC 7468 explanatory
// text); anything else yields an error that names the input. A file whose
// certificates are all self-signed CAs is a trust bundle. Input that is not
// PEM at all may be a single DER certificate.
func ParsePEM(name string, data []byte) (*Input, error) {
	in := &Input{Name: name, Origin: OriginFile}
	if name == "-" {
		in.Origin = OriginStdin
	}
	fail := func(format string, args ...any) (*Input, error) {
		return nil, fmt.Errorf("inspect: %s: %s", displayName(name), fmt.Sprintf(format, args...))
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return fail("empty input")
	}
	rest := data
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		n++
		if len(b.Headers) != 0 {
			return fail("PEM block %d (%s) has headers; encrypted PEM is not supported", n, b.Type)
		}
		switch b.Type {
		case certs.BlockCertificate:
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return fail("PEM block %d: malformed certificate: %v", n, err)
			}
			in.Certs = append(in.Certs, c)
		case certs.BlockCSR, "NEW CERTIFICATE REQUEST":
			if in.CSR != nil {
				return fail("more than one CSR")
			}
			csr, err := x509.ParseCertificateRequest(b.Bytes)
			if err != nil {
				return fail("PEM block %d: malformed CSR: %v", n, err)
			}
			in.CSR = csr
		case certs.BlockPKCS8, certs.BlockECKey, certs.BlockRSAKey:
			if in.Key != nil {
				return fail("more than one private key")
			}
			// certs never puts key bytes into its errors.
			k, err := certs.ParsePrivateKeyBlock(b)
			if err != nil {
				return fail("PEM block %d: %v", n, err)
			}
			in.Key = k
		case "ENCRYPTED PRIVATE KEY":
			return fail("PEM block %d: encrypted private keys are not supported", n)
		case certs.BlockECParams:
			// Written by `openssl ecparam -genkey` before the key; nothing to check.
		default:
			return fail("unknown PEM block type %q (block %d)", b.Type, n)
		}
	}
	if trailing := bytes.TrimSpace(rest); len(trailing) != 0 {
		switch {
		case n == 0 && !bytes.Contains(trailing, []byte("-----BEGIN")):
			c, err := x509.ParseCertificate(data)
			if err != nil {
				return fail("not PEM: no -----BEGIN line found, and not a DER certificate either")
			}
			in.Certs = append(in.Certs, c)
		case bytes.Contains(trailing, []byte("-----BEGIN")):
			return fail("truncated or corrupt PEM block after %d good block(s)", n)
		default:
			return fail("unexpected data after the last PEM block (block %d)", n)
		}
	}
	if in.CSR != nil && len(in.Certs) != 0 {
		return fail("holds both certificates and a CSR; give them as separate files")
	}
	if len(in.Certs) == 0 && in.CSR == nil && in.Key == nil {
		return fail("no certificate, key or CSR found")
	}
	in.Bundle = allSelfSignedCAs(in.Certs)
	return in, nil
}

func displayName(name string) string {
	if name == "-" {
		return "stdin"
	}
	return name
}

func allSelfSignedCAs(cs []*x509.Certificate) bool {
	if len(cs) == 0 {
		return false
	}
	for _, c := range cs {
		if !c.IsCA || !selfSigned(c) {
			return false
		}
	}
	return true
}

// selfSigned reports whether c names itself as issuer and its signature
// verifies with its own key.
func selfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature) == nil
}

// Load reads a PEM (or DER) file or a CA directory and returns its inputs.
// Standard input is the caller's to read; it goes through ParsePEM("-", ...).
func Load(path string) ([]*Input, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %s: %w", path, unwrapPathError(err))
	}
	if st.IsDir() {
		return LoadDir(path)
	}
	in, err := loadFile(path)
	if err != nil {
		return nil, err
	}
	return []*Input{in}, nil
}

func loadFile(path string) (*Input, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %s: %w", path, unwrapPathError(err))
	}
	return ParsePEM(path, data)
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// LoadDir reads a CA directory in one of the layouts meshid and Istio use:
//
//   - cacerts: ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem
//   - Kubernetes TLS: tls.crt, tls.key, ca.crt
//   - a root from `meshid certs root`: root-cert.pem, root-key.pem
//
// The signing certificate becomes one input (with its key and chain, and
// the directory's roots as Roots) and the root file another.
func LoadDir(dir string) ([]*Input, error) {
	has := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}
	switch {
	case has("ca-cert.pem"):
		return loadLayout(dir, "ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem")
	case has("tls.crt"):
		return loadLayout(dir, "tls.crt", "tls.key", "", "ca.crt")
	case has("root-cert.pem"):
		return loadLayout(dir, "", "root-key.pem", "", "root-cert.pem")
	}
	return nil, fmt.Errorf("inspect: %s: not a CA directory (want ca-cert.pem, tls.crt or root-cert.pem)", dir)
}

// loadLayout loads certFile (+keyFile, +chainFile) as the signing input and
// rootFile as a trust bundle. Empty names are skipped; a missing optional
// file is fine, but a present one must parse.
func loadLayout(dir, certFile, keyFile, chainFile, rootFile string) ([]*Input, error) {
	opt := func(name string) (*Input, error) {
		if name == "" {
			return nil, nil
		}
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return loadFile(p)
	}
	var out []*Input
	roots, err := opt(rootFile)
	if err != nil {
		return nil, err
	}
	if roots != nil {
		if len(roots.Certs) == 0 {
			return nil, fmt.Errorf("inspect: %s: no certificates", roots.Name)
		}
		roots.Bundle = true
	}
	key, err := opt(keyFile)
	if err != nil {
		return nil, err
	}
	if key != nil && (key.Key == nil || len(key.Certs) != 0 || key.CSR != nil) {
		return nil, fmt.Errorf("inspect: %s: want exactly one private key", key.Name)
	}
	if certFile != "" {
		signing, err := loadFile(filepath.Join(dir, certFile))
		if err != nil {
			return nil, err
		}
		if len(signing.Certs) == 0 {
			return nil, fmt.Errorf("inspect: %s: no certificates", signing.Name)
		}
		chain, err := opt(chainFile)
		if err != nil {
			return nil, err
		}
		if chain != nil {
			signing.Certs = mergeChain(signing.Certs, chain.Certs)
		}
		signing.Bundle = false
		if key != nil {
			signing.Key, signing.KeyName = key.Key, key.Name
		}
		if roots != nil {
			signing.Roots, signing.RootsName = roots.Certs, roots.Name
		}
		out = append(out, signing)
	} else if roots != nil && key != nil {
		roots.Key, roots.KeyName = key.Key, key.Name
	}
	if roots != nil {
		out = append(out, roots)
	}
	return out, nil
}

// mergeChain appends the certificates of chain (Istio's cert-chain.pem, which
// starts with the signing certificate itself) that are not already in head.
func mergeChain(head, chain []*x509.Certificate) []*x509.Certificate {
	out := append([]*x509.Certificate(nil), head...)
	for _, c := range chain {
		dup := false
		for _, h := range out {
			if h.Equal(c) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// PairKeys gives a lone key file to a lone certificate file that has no key
// of its own, as in `meshid inspect tls.crt tls.key`, so the key is checked
// against the certificate. It returns inputs unchanged otherwise.
func PairKeys(inputs []*Input) {
	var keys, certsNoKey []*Input
	for _, in := range inputs {
		switch {
		case in.Type() == TypeKey:
			keys = append(keys, in)
		case len(in.Certs) != 0 && in.Key == nil && !in.Bundle:
			certsNoKey = append(certsNoKey, in)
		}
	}
	if len(keys) == 1 && len(certsNoKey) == 1 {
		certsNoKey[0].Key, certsNoKey[0].KeyName = keys[0].Key, keys[0].Name
	}
}
