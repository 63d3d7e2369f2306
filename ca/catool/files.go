package catool

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
)

// Files of a root directory (Root) and of an Istio cacerts directory
// (Intermediate).
const (
	RootCertFile  = keystore.RootCertFile
	RootKeyFile   = keystore.RootKeyFile
	CACertFile    = keystore.CACertFile
	CAKeyFile     = keystore.CAKeyFile
	CertChainFile = keystore.CertChainFile
)

// caKeyType applies the default key type (ec-p256) and checks that kt is
// one a CA may use (certs.CAKeyTypes).
func caKeyType(kt *certs.KeyType) error {
	if *kt == "" {
		*kt = certs.ECP256
	}
	if _, err := certs.ParseCAKeyType(string(*kt)); err != nil {
		return fmt.Errorf("certs: --key-type %q: want one of %s", *kt, certs.KeyTypeNames(certs.CAKeyTypes))
	}
	return nil
}

// refuseKeyOverwrite fails when dir/keyFile exists and force is not set: a CA
// key that is overwritten is gone for good.
func refuseKeyOverwrite(dir, keyFile string, force bool) error {
	p := filepath.Join(dir, keyFile)
	_, err := os.Stat(p)
	switch {
	case err == nil && !force:
		return fmt.Errorf("certs: %s exists; refusing to overwrite a CA key without --force", p)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("certs: %v", err)
	}
	return nil
}

type file struct {
	name  string
	data  []byte
	perm  os.FileMode
	about string
}

// writeFiles creates dir and writes each file atomically, in order,
// reporting each one to w.
func writeFiles(w io.Writer, dir string, files []file) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certs: %v", err)
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := certs.WriteFileAtomic(p, f.data, f.perm); err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s (%s)\n", p, f.about)
	}
	return nil
}

// keyFile is key as a PEM file of mode 0600.
func keyFile(name string, key crypto.Signer) (file, error) {
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		return file{}, err
	}
	return file{name, keyPEM, 0o600, certs.KeyTypeOf(key.Public()) + " private key"}, nil
}

// Describe is the one-line summary of a CA certificate that the commands
// print: subject, key type, path length and expiry.
func Describe(c *x509.Certificate) string {
	pathLen := "unlimited"
	if c.MaxPathLen > 0 || c.MaxPathLenZero {
		pathLen = fmt.Sprint(c.MaxPathLen)
	}
	return fmt.Sprintf("%s, %s, pathlen %s, valid until %s", c.Subject.String(), certs.KeyTypeOf(c.PublicKey), pathLen, c.NotAfter.UTC().Format(time.RFC3339))
}
