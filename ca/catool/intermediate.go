package catool

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// IntermediateConfig describes a cluster's intermediate CA directory in the
// Istio cacerts layout: ca-cert.pem, ca-key.pem (0600, unless KeyURI),
// cert-chain.pem (the intermediate, then the root) and root-cert.pem.
type IntermediateConfig struct {
	RootDir string        // --root: holds root-cert.pem and root-key.pem; required
	Dir     string        // --out; required
	Name    string        // --name: the cluster, the subject's L; required, see ClusterNameRE
	KeyType certs.KeyType // default ec-p256; one of certs.CAKeyTypes
	// TTL is the lifetime. Zero means DefaultCATTL, shortened to end with
	// the root; an explicit TTL past the root's end is refused unless
	// AllowOutlive.
	TTL          time.Duration
	AllowOutlive bool
	Org          string // the subject's O; "" = the root's
	CN           string // the subject's CN; the flag defaults to DefaultIntermediateCN
	Force        bool   // replace an existing ca-key.pem
	// KeyURI, when set, creates the key in that PKCS#11 module (sensitive,
	// not extractable) and writes no ca-key.pem.
	KeyURI *pkcs11.URI
	Clock  clock.Clock // default the real clock
	Report io.Writer   // one line per file written; default discard
}

// ClusterNameRE is what Istio accepts as a cluster ID, and what is safe as
// both a subject attribute and a directory name in certs/Makefile.
var ClusterNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func (c *IntermediateConfig) setDefaults() error {
	switch {
	case c.RootDir == "":
		return fmt.Errorf("certs intermediate: --root is required")
	case c.Dir == "":
		return fmt.Errorf("certs intermediate: --out is required")
	case !ClusterNameRE.MatchString(c.Name):
		return fmt.Errorf("certs intermediate: --name %q: want letters, digits, '.', '_' or '-' (at most 63)", c.Name)
	case c.TTL < 0:
		return fmt.Errorf("certs intermediate: --ttl must be positive")
	}
	if err := caKeyType(&c.KeyType); err != nil {
		return err
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Report == nil {
		c.Report = io.Discard
	}
	return nil
}

// Intermediate creates a cluster's intermediate CA (pathlen 0, L=Name)
// signed by the root in cfg.RootDir, writes its directory, and loads it
// back as `meshid server --ca-dir` would.
func Intermediate(cfg IntermediateConfig) (*x509.Certificate, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	now := cfg.Clock.Now().UTC().Truncate(time.Second)
	root, err := LoadRoot(cfg.RootDir, now)
	if err != nil {
		return nil, err
	}
	notBefore, notAfter, err := intermediateValidity(cfg, root.Cert, now)
	if err != nil {
		return nil, err
	}
	if err := refuseKeyOverwrite(cfg.Dir, CAKeyFile, cfg.Force && cfg.KeyURI == nil); err != nil {
		if cfg.KeyURI != nil {
			// A module key and a key file in one directory would leave
			// doubt about which key the CA uses; keystore refuses that.
			return nil, fmt.Errorf("%v (the key is to be created in the module; remove the file)", err)
		}
		return nil, err
	}
	key, err := intermediateKey(cfg)
	if err != nil {
		return nil, err
	}
	if c, ok := key.(io.Closer); ok {
		defer c.Close()
	}
	org := cfg.Org
	if org == "" {
		org = first(root.Cert.Subject.Organization)
	}
	inter, err := issueCA(caSpec{
		subject:    subject(org, cfg.CN, cfg.Name),
		key:        key,
		notBefore:  notBefore,
		notAfter:   notAfter,
		maxPathLen: 0,
	}, root.Cert, root.Key)
	if err != nil {
		return nil, fmt.Errorf("certs intermediate: %v", err)
	}
	return inter, writeIntermediate(cfg, inter, root, key, now)
}

// intermediateKey creates the intermediate's key: in the module of
// cfg.KeyURI, or in memory for ca-key.pem.
func intermediateKey(cfg IntermediateConfig) (crypto.Signer, error) {
	if cfg.KeyURI == nil {
		key, err := certs.GenerateKey(cfg.KeyType)
		if err != nil {
			return nil, fmt.Errorf("certs intermediate: %v", err)
		}
		return key, nil
	}
	key, err := pkcs11.Generate(pkcs11.Config{URI: cfg.KeyURI}, cfg.KeyType)
	if err != nil {
		return nil, fmt.Errorf("certs intermediate: %v", err)
	}
	fmt.Fprintf(cfg.Report, "created %s (%s, not extractable) in token %s\n", key, cfg.KeyType, cfg.KeyURI.Token+cfg.KeyURI.Serial)
	return key, nil
}

// RootDir is a root directory loaded by LoadRoot.
type RootDir struct {
	Cert  *x509.Certificate   // the root the key belongs to
	Key   crypto.Signer       // its key
	Roots []*x509.Certificate // every root in root-cert.pem
}

// LoadRoot reads dir/root-cert.pem and dir/root-key.pem, as written by Root.
// root-cert.pem may hold several roots; the signing root is the one the key
// belongs to. It must be a CA valid at now that may sign an intermediate.
func LoadRoot(dir string, now time.Time) (*RootDir, error) {
	certPath, keyPath := filepath.Join(dir, RootCertFile), filepath.Join(dir, RootKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certs intermediate: --root: %v", err)
	}
	roots, err := certs.ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certs intermediate: %s: %v", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certs intermediate: --root: %v", err)
	}
	key, err := certs.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certs intermediate: %s: %v", keyPath, err)
	}
	var root *x509.Certificate
	for _, c := range roots {
		if certs.KeyMatches(c.PublicKey, key) {
			root = c
			break
		}
	}
	switch {
	case root == nil:
		return nil, fmt.Errorf("certs intermediate: %s does not belong to any certificate in %s", keyPath, certPath)
	case !root.IsCA:
		return nil, fmt.Errorf("certs intermediate: %s: %q is not a CA", certPath, root.Subject.String())
	case now.After(root.NotAfter):
		return nil, fmt.Errorf("certs intermediate: %s: the root expired at %s", certPath, root.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(root.NotBefore):
		return nil, fmt.Errorf("certs intermediate: %s: the root is not valid until %s", certPath, root.NotBefore.UTC().Format(time.RFC3339))
	case root.BasicConstraintsValid && root.MaxPathLen == 0 && root.MaxPathLenZero:
		return nil, fmt.Errorf("certs intermediate: %s: %q has pathlen 0 and cannot sign an intermediate", certPath, root.Subject.String())
	}
	return &RootDir{Cert: root, Key: key, Roots: roots}, nil
}

// intermediateValidity is the intermediate's window: NotBefore backdated,
// never before the root's; the default TTL cut to the root's end, an
// explicit one past it refused unless AllowOutlive.
func intermediateValidity(cfg IntermediateConfig, root *x509.Certificate, now time.Time) (time.Time, time.Time, error) {
	notBefore := now.Add(-Backdate)
	if notBefore.Before(root.NotBefore) {
		notBefore = root.NotBefore
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = DefaultCATTL
	}
	if end := notBefore.Add(ttl); end.After(root.NotAfter) {
		switch {
		case cfg.TTL == 0:
			ttl = root.NotAfter.Sub(notBefore) // the default never outlives the root
		case !cfg.AllowOutlive:
			return time.Time{}, time.Time{}, fmt.Errorf("certs intermediate: --ttl %s would end at %s, after the root expires at %s; shorten --ttl or pass --allow-outlive",
				ttl, end.Format(time.RFC3339), root.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return notBefore, notBefore.Add(ttl), nil
}

// writeIntermediate writes the intermediate's CA directory (its key file
// only when the key is not in a module) and loads it back as `meshid
// server --ca-dir` would.
func writeIntermediate(cfg IntermediateConfig, inter *x509.Certificate, root *RootDir, key crypto.Signer, now time.Time) error {
	files := []file{
		{CACertFile, certs.EncodeCertificates(inter), 0o644, Describe(inter)},
		{CertChainFile, certs.EncodeCertificates(inter, root.Cert), 0o644, "the intermediate, then the root"},
		{RootCertFile, certs.EncodeCertificates(root.Roots...), 0o644, fmt.Sprintf("%d root(s)", len(root.Roots))},
	}
	if cfg.KeyURI == nil {
		kf, err := keyFile(CAKeyFile, key)
		if err != nil {
			return fmt.Errorf("certs intermediate: %v", err)
		}
		files = append(files, kf)
	}
	if err := writeFiles(cfg.Report, cfg.Dir, files); err != nil {
		return err
	}
	// The directory is what `meshid server --ca-dir` loads: check it the
	// same way before anyone deploys it.
	var err error
	if cfg.KeyURI != nil {
		_, err = keystore.LoadDirSigner(cfg.Dir, key, now)
	} else {
		_, err = keystore.LoadDir(cfg.Dir, now)
	}
	if err != nil {
		return fmt.Errorf("certs intermediate: the written directory does not load as a CA: %v", err)
	}
	return nil
}
