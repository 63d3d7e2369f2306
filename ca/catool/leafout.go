package catool

import (
	"fmt"
	"io"

	"github.com/meshid/meshid/certs"
)

// LeafOutput is where WriteLeaf puts a minted leaf. "-" is Stdout.
type LeafOutput struct {
	Cert  string // the chain, leaf first (--out-cert)
	Key   string // the private key (--out-key): a new 0600 file, see CreateKeyFile
	Roots string // the CA's roots (--out-roots); "" = not written
	// ForceInsecure lets the key go to Stdout, over an existing path or
	// into a directory others may write (--force-insecure-output).
	ForceInsecure bool
	Stdout        io.Writer
}

// WriteLeaf writes m as out says, the key first, so that a refused key
// path writes nothing at all.
func WriteLeaf(m *Minted, out LeafOutput) error {
	if out.Key == "-" && !out.ForceInsecure {
		return fmt.Errorf("certs leaf: --out-key -: %v", ErrInsecureOutput)
	}
	keyPEM, err := certs.EncodePrivateKey(m.Key)
	if err != nil {
		return fmt.Errorf("certs leaf: %v", err)
	}
	switch {
	case !out.ForceInsecure:
		err = CreateKeyFile(out.Key, keyPEM)
	case out.Key == "-":
		_, err = out.Stdout.Write(keyPEM)
	default:
		err = certs.WriteFileAtomic(out.Key, keyPEM, 0o600)
	}
	if err != nil {
		return fmt.Errorf("certs leaf: --out-key %v", err)
	}
	if err := writePublic(out.Stdout, out.Cert, certs.EncodeCertificates(m.Chain...)); err != nil {
		return fmt.Errorf("certs leaf: --out-cert: %v", err)
	}
	if out.Roots == "" {
		return nil
	}
	if err := writePublic(out.Stdout, out.Roots, certs.EncodeCertificates(m.Roots...)); err != nil {
		return fmt.Errorf("certs leaf: --out-roots: %v", err)
	}
	return nil
}

// writePublic writes certificates to path, or to w for "-".
func writePublic(w io.Writer, path string, data []byte) error {
	if path == "-" {
		_, err := w.Write(data)
		return err
	}
	return certs.WriteFileAtomic(path, data, 0o644)
}
