package main

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// certsClock is the time `meshid certs` starts certificates at; tests set
// a fake clock.
var certsClock clock.Clock = clock.Real{}

// defaultCATTL is ten years, the lifetime Istio's tools/certs gives roots.
const defaultCATTL = 87600 * time.Hour

// caBackdate moves a new CA's NotBefore into the past so that machines whose
// clocks run a little behind accept it at once (as keystore does for the
// self-signed root).
const caBackdate = 5 * time.Minute

// Files of a root directory (meshid certs root) and of an Istio cacerts
// directory (meshid certs intermediate).
const (
	caFileRootCert  = "root-cert.pem"
	caFileRootKey   = "root-key.pem"
	caFileCACert    = "ca-cert.pem"
	caFileCAKey     = "ca-key.pem"
	caFileCertChain = "cert-chain.pem"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create a CA hierarchy: a root, and per-cluster intermediates in the Istio cacerts layout",
		Long: `meshid certs replaces the openssl Makefiles of Istio's tools/certs.

  meshid certs root --out root/
  meshid certs intermediate --root root/ --out west/ --name west
  kubectl create secret generic cacerts -n istio-system --from-file=west/

The intermediate directory drops straight into "meshid server --ca-dir" and
into Istio's cacerts secret. See also certs/Makefile.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newCertsRootCmd(), newCertsIntermediateCmd())
	cmd.AddCommand(newRotationCmds()...)
	return cmd
}

type certsRootFlags struct {
	out     string
	keyType string
	ttl     dayDuration
	org     string
	cn      string
	force   bool
}

func newCertsRootCmd() *cobra.Command {
	f := &certsRootFlags{ttl: dayDuration(defaultCATTL)}
	cmd := &cobra.Command{
		Use:   "root --out DIR",
		Short: "Create a self-signed root CA: DIR/root-cert.pem and DIR/root-key.pem (0600)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runCertsRoot(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "`directory` to write root-cert.pem and root-key.pem to (required)")
	fl.StringVar(&f.keyType, "key-type", string(certs.ECP256), "key type: "+certs.KeyTypeNames(certs.CAKeyTypes))
	fl.Var(&f.ttl, "ttl", "lifetime of the root (e.g. 87600h or 3650d)")
	fl.StringVar(&f.org, "org", "meshid", "subject organization (O)")
	fl.StringVar(&f.cn, "cn", "Root CA", "subject common name (CN)")
	fl.BoolVar(&f.force, "force", false, "overwrite an existing root-key.pem")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func runCertsRoot(cmd *cobra.Command, f *certsRootFlags) error {
	kt, err := caKeyType(f.keyType)
	if err != nil {
		return err
	}
	if f.ttl <= 0 {
		return errors.New("certs root: --ttl must be positive")
	}
	if err := refuseKeyOverwrite(f.out, caFileRootKey, f.force); err != nil {
		return err
	}
	key, err := certs.GenerateKey(kt)
	if err != nil {
		return fmt.Errorf("certs root: %v", err)
	}
	root, err := certs.NewRootCA(certs.CASpec{
		Subject:    caSubject(f.org, f.cn, ""),
		Key:        key,
		NotBefore:  certsClock.Now().UTC().Truncate(time.Second).Add(-caBackdate),
		TTL:        time.Duration(f.ttl),
		MaxPathLen: -1,
	})
	if err != nil {
		return fmt.Errorf("certs root: %v", err)
	}
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs root: %v", err)
	}
	// The key is written last, so an interrupted run leaves no key that
	// would need --force to replace.
	return writeCAFiles(cmd.OutOrStdout(), f.out, []caFile{
		{caFileRootCert, certs.EncodeCertificates(root), 0o644, describeCA(root)},
		{caFileRootKey, keyPEM, 0o600, certs.KeyTypeOf(key.Public()) + " private key"},
	})
}

type certsIntermediateFlags struct {
	root         string
	out          string
	name         string
	keyType      string
	ttl          dayDuration
	org          string
	cn           string
	force        bool
	allowOutlive bool
	key          string
}

func newCertsIntermediateCmd() *cobra.Command {
	f := &certsIntermediateFlags{ttl: dayDuration(defaultCATTL)}
	cmd := &cobra.Command{
		Use:   "intermediate --root DIR --out DIR --name CLUSTER",
		Short: "Create a cluster's intermediate CA as an Istio cacerts directory",
		Long: `Writes DIR/ca-cert.pem, DIR/ca-key.pem (0600), DIR/cert-chain.pem (the
intermediate, then the root) and DIR/root-cert.pem. The intermediate has
pathlen 0 and L=<cluster> in its subject, like Istio's tools/certs.

Without --ttl the lifetime is 87600h, shortened to end with the root. An
explicit --ttl that outlives the root is refused unless --allow-outlive.

With --key pkcs11:token=...;object=...?module-path=...&pin-source=... (an
RFC 7512 URI) the intermediate's key is created in that PKCS#11 module,
sensitive and not extractable, and no ca-key.pem is written: run the CA with
--ca-dir DIR and the same URI as its CA key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCertsIntermediate(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.root, "root", "", "`directory` holding root-cert.pem and root-key.pem (required)")
	fl.StringVar(&f.out, "out", "", "`directory` to write the cacerts files to (required)")
	fl.StringVar(&f.name, "name", "", "cluster name, the subject's L (required)")
	fl.StringVar(&f.keyType, "key-type", string(certs.ECP256), "key type: "+certs.KeyTypeNames(certs.CAKeyTypes))
	fl.Var(&f.ttl, "ttl", "lifetime of the intermediate (e.g. 87600h or 730d)")
	fl.StringVar(&f.org, "org", "", "subject organization (O) (default: the root's)")
	fl.StringVar(&f.cn, "cn", "Intermediate CA", "subject common name (CN)")
	fl.BoolVar(&f.force, "force", false, "overwrite an existing ca-key.pem")
	fl.BoolVar(&f.allowOutlive, "allow-outlive", false, "allow an explicit --ttl that ends after the root expires")
	fl.StringVar(&f.key, "key", "", "where to create the intermediate's key: empty = DIR/ca-key.pem; a pkcs11: URI = in that PKCS#11 module (object= names the new key)")
	for _, n := range []string{"root", "out", "name"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

// clusterNameRE is what Istio accepts as a cluster ID, and what is safe as
// both a subject attribute and a directory name in certs/Makefile.
var clusterNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func runCertsIntermediate(cmd *cobra.Command, f *certsIntermediateFlags) error {
	if !clusterNameRE.MatchString(f.name) {
		return fmt.Errorf("certs intermediate: --name %q: want letters, digits, '.', '_' or '-' (at most 63)", f.name)
	}
	kt, err := caKeyType(f.keyType)
	if err != nil {
		return err
	}
	if f.ttl <= 0 {
		return errors.New("certs intermediate: --ttl must be positive")
	}
	now := certsClock.Now().UTC().Truncate(time.Second)
	root, rootKey, roots, err := loadRootDir(f.root, now)
	if err != nil {
		return err
	}
	notBefore, ttl, err := intermediateValidity(cmd, f, root, now)
	if err != nil {
		return err
	}
	uri, err := intermediateKeyURI(f)
	if err != nil {
		return err
	}
	org := f.org
	if org == "" && len(root.Subject.Organization) != 0 {
		org = root.Subject.Organization[0]
	}
	var key crypto.Signer
	if uri != nil {
		hsmKey, err := pkcs11.Generate(pkcs11.Config{URI: uri}, kt)
		if err != nil {
			return fmt.Errorf("certs intermediate: %v", err)
		}
		defer hsmKey.Close()
		fmt.Fprintf(cmd.OutOrStdout(), "created %s (%s, not extractable) in token %s\n", hsmKey, kt, uri.Token+uri.Serial)
		key = hsmKey
	} else if key, err = certs.GenerateKey(kt); err != nil {
		return fmt.Errorf("certs intermediate: %v", err)
	}
	inter, err := certs.NewIntermediateCA(certs.CASpec{
		Subject:    caSubject(org, f.cn, f.name),
		Key:        key,
		NotBefore:  notBefore,
		TTL:        ttl,
		MaxPathLen: 0,
	}, root, rootKey)
	if err != nil {
		return fmt.Errorf("certs intermediate: %v", err)
	}
	return writeIntermediate(cmd, f.out, inter, root, roots, key, uri, now)
}

// loadRootDir reads DIR/root-cert.pem and DIR/root-key.pem. root-cert.pem may
// hold several roots; the signing root is the one the key belongs to.
func loadRootDir(dir string, now time.Time) (root *x509.Certificate, key crypto.Signer, roots []*x509.Certificate, err error) {
	certPath, keyPath := filepath.Join(dir, caFileRootCert), filepath.Join(dir, caFileRootKey)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs intermediate: --root: %v", err)
	}
	roots, err = certs.ParseCertificates(certPEM)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s: %v", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs intermediate: --root: %v", err)
	}
	key, err = certs.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s: %v", keyPath, err)
	}
	for _, c := range roots {
		if certs.KeyMatches(c.PublicKey, key) {
			root = c
			break
		}
	}
	switch {
	case root == nil:
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s does not belong to any certificate in %s", keyPath, certPath)
	case !root.IsCA:
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s: %q is not a CA", certPath, root.Subject.String())
	case now.After(root.NotAfter):
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s: the root expired at %s", certPath, root.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(root.NotBefore):
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s: the root is not valid until %s", certPath, root.NotBefore.UTC().Format(time.RFC3339))
	case root.BasicConstraintsValid && root.MaxPathLen == 0 && root.MaxPathLenZero:
		return nil, nil, nil, fmt.Errorf("certs intermediate: %s: %q has pathlen 0 and cannot sign an intermediate", certPath, root.Subject.String())
	}
	return root, key, roots, nil
}

// caKeyType accepts the key types a CA may use, certs.CAKeyTypes.
func caKeyType(s string) (certs.KeyType, error) {
	kt, err := certs.ParseCAKeyType(s)
	if err != nil {
		return "", fmt.Errorf("certs: --key-type %q: want one of %s", s, certs.KeyTypeNames(certs.CAKeyTypes))
	}
	return kt, nil
}

func caSubject(org, cn, locality string) pkix.Name {
	n := pkix.Name{CommonName: cn}
	if org != "" {
		n.Organization = []string{org}
	}
	if locality != "" {
		n.Locality = []string{locality}
	}
	return n
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

type caFile struct {
	name  string
	data  []byte
	perm  os.FileMode
	about string
}

// writeCAFiles creates dir and writes each file atomically, in order,
// reporting each one.
func writeCAFiles(w io.Writer, dir string, files []caFile) error {
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

func describeCA(c *x509.Certificate) string {
	pathLen := "unlimited"
	if c.MaxPathLen > 0 || c.MaxPathLenZero {
		pathLen = fmt.Sprint(c.MaxPathLen)
	}
	return fmt.Sprintf("%s, %s, pathlen %s, valid until %s", c.Subject.String(), certs.KeyTypeOf(c.PublicKey), pathLen, c.NotAfter.UTC().Format(time.RFC3339))
}

// intermediateValidity is the intermediate's NotBefore (backdated, never
// before the root's) and TTL: the default --ttl is cut to the root's end, an
// explicit one past it is refused unless --allow-outlive.
func intermediateValidity(cmd *cobra.Command, f *certsIntermediateFlags, root *x509.Certificate, now time.Time) (time.Time, time.Duration, error) {
	notBefore := now.Add(-caBackdate)
	if notBefore.Before(root.NotBefore) {
		notBefore = root.NotBefore
	}
	ttl := time.Duration(f.ttl)
	if end := notBefore.Add(ttl); end.After(root.NotAfter) {
		switch {
		case !cmd.Flags().Changed("ttl"):
			ttl = root.NotAfter.Sub(notBefore) // the default never outlives the root
		case !f.allowOutlive:
			return time.Time{}, 0, fmt.Errorf("certs intermediate: --ttl %s would end at %s, after the root expires at %s; shorten --ttl or pass --allow-outlive",
				ttl, end.Format(time.RFC3339), root.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	return notBefore, ttl, nil
}

// intermediateKeyURI is the module key of --key (nil for a ca-key.pem
// file), refusing to overwrite a key file.
func intermediateKeyURI(f *certsIntermediateFlags) (*pkcs11.URI, error) {
	switch {
	case f.key == "":
		return nil, refuseKeyOverwrite(f.out, caFileCAKey, f.force)
	case pkcs11.IsURI(f.key):
		uri, err := pkcs11.ParseURI(f.key)
		if err != nil {
			return nil, fmt.Errorf("certs intermediate: --key: %v", err)
		}
		// A module key and a key file in one directory would leave doubt
		// about which key the CA uses; keystore refuses that layout.
		if err := refuseKeyOverwrite(f.out, caFileCAKey, false); err != nil {
			return nil, fmt.Errorf("%v (the key is to be created in the module; remove the file)", err)
		}
		return uri, nil
	}
	return nil, fmt.Errorf("certs intermediate: --key %q: want a pkcs11: URI (or no --key for a ca-key.pem file)", f.key)
}

// writeIntermediate writes the intermediate's CA directory to dir (its key
// file only when the key is not in a module) and loads it back as
// `meshid server --ca-dir` would.
func writeIntermediate(cmd *cobra.Command, dir string, inter, root *x509.Certificate, roots []*x509.Certificate, key crypto.Signer, uri *pkcs11.URI, now time.Time) error {
	files := []caFile{
		{caFileCACert, certs.EncodeCertificates(inter), 0o644, describeCA(inter)},
		{caFileCertChain, certs.EncodeCertificates(inter, root), 0o644, "the intermediate, then the root"},
		{caFileRootCert, certs.EncodeCertificates(roots...), 0o644, fmt.Sprintf("%d root(s)", len(roots))},
	}
	if uri == nil {
		keyPEM, err := certs.EncodePrivateKey(key)
		if err != nil {
			return fmt.Errorf("certs intermediate: %v", err)
		}
		files = append(files, caFile{caFileCAKey, keyPEM, 0o600, certs.KeyTypeOf(key.Public()) + " private key"})
	}
	if err := writeCAFiles(cmd.OutOrStdout(), dir, files); err != nil {
		return err
	}
	// The directory is what `meshid server --ca-dir` loads: check it the
	// same way before anyone deploys it.
	load := keystore.LoadDir
	if uri != nil {
		load = func(dir string, now time.Time) (*keystore.Bundle, error) {
			return keystore.LoadDirSigner(dir, key, now)
		}
	}
	if _, err := load(dir, now); err != nil {
		return fmt.Errorf("certs intermediate: the written directory does not load as a CA: %v", err)
	}
	return nil
}
