package catool

import (
	"crypto/x509"
	"fmt"
	"io"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// DefaultCATTL is ten years, the lifetime Istio's tools/certs gives roots
// and intermediates.
const DefaultCATTL = 87600 * time.Hour

// Backdate moves a new CA's NotBefore into the past so that machines whose
// clocks run a little behind accept it at once (as keystore does for the
// self-signed root).
const Backdate = 5 * time.Minute

// Defaults of the subject flags.
const (
	DefaultRootOrg        = "meshid"
	DefaultRootCN         = "Root CA"
	DefaultIntermediateCN = "Intermediate CA"
)

// RootConfig describes a root CA directory: Dir/root-cert.pem and
// Dir/root-key.pem (0600).
type RootConfig struct {
	Dir     string        // --out, required
	KeyType certs.KeyType // default ec-p256; one of certs.CAKeyTypes
	TTL     time.Duration // default DefaultCATTL
	Org, CN string        // the subject's O and CN, as given ("" leaves one out); the flags default to DefaultRootOrg, DefaultRootCN
	Force   bool          // replace an existing root-key.pem
	Clock   clock.Clock   // default the real clock
	Report  io.Writer     // one line per file written; default discard
}

func (c *RootConfig) setDefaults() error {
	if c.Dir == "" {
		return fmt.Errorf("certs root: --out is required")
	}
	if err := caKeyType(&c.KeyType); err != nil {
		return err
	}
	switch {
	case c.TTL == 0:
		c.TTL = DefaultCATTL
	case c.TTL < 0:
		return fmt.Errorf("certs root: --ttl must be positive")
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Report == nil {
		c.Report = io.Discard
	}
	return nil
}

// Root creates a self-signed root CA with unlimited path length and writes
// its directory. It refuses to replace a root-key.pem unless cfg.Force.
func Root(cfg RootConfig) (*x509.Certificate, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := refuseKeyOverwrite(cfg.Dir, RootKeyFile, cfg.Force); err != nil {
		return nil, err
	}
	key, err := certs.GenerateKey(cfg.KeyType)
	if err != nil {
		return nil, fmt.Errorf("certs root: %v", err)
	}
	notBefore := cfg.Clock.Now().UTC().Truncate(time.Second).Add(-Backdate)
	root, err := issueCA(caSpec{
		subject:    subject(cfg.Org, cfg.CN, ""),
		key:        key,
		notBefore:  notBefore,
		notAfter:   notBefore.Add(cfg.TTL),
		maxPathLen: -1,
	}, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("certs root: %v", err)
	}
	kf, err := keyFile(RootKeyFile, key)
	if err != nil {
		return nil, fmt.Errorf("certs root: %v", err)
	}
	// The key is written last, so an interrupted run leaves no key that
	// would need --force to replace.
	return root, writeFiles(cfg.Report, cfg.Dir, []file{
		{RootCertFile, certs.EncodeCertificates(root), 0o644, Describe(root)},
		kf,
	})
}
