package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/catool"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
)

type certsLeafFlags struct {
	id, caDir, keyType        string
	ttl                       dayDuration
	outCert, outKey, outRoots string
	forceInsecure             bool
}

func newCertsLeafCmd() *cobra.Command {
	f := &certsLeafFlags{}
	cmd := &cobra.Command{
		Use:   "leaf --id spiffe://TD/ns/NS/sa/SA --ca-dir DIR --out-key FILE",
		Short: "Mint a workload certificate and key from a CA directory, for tests and debugging",
		Long: `Signs a leaf for --id with the CA in --ca-dir (the directory "meshid server
--ca-dir" loads), with the CA's own signing code and policy, so it is what the
CA would issue. Like "spire-server x509 mint".

The chain (leaf, then intermediates) goes to --out-cert (default: standard
output). The key goes to --out-key, which must be a new file: it is created
with mode 0600, and an existing path (file, symbolic link, directory) or a
directory another user owns or may write to is refused. --out-key - (standard
output) and those refusals are overridden only by --force-insecure-output.`,
		Example: `  meshid certs leaf --id spiffe://cluster.local/ns/shop/sa/cart --ca-dir west/ \
      --out-cert cart.pem --out-key cart-key.pem --out-roots roots.pem
  meshid inspect --roots roots.pem cart.pem cart-key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCertsLeaf(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.id, "id", "", "SPIFFE `ID` of the leaf (required)")
	fl.StringVar(&f.caDir, "ca-dir", "", "CA `directory` (Istio cacerts or Kubernetes TLS layout) to sign with (required)")
	fl.StringVar(&f.keyType, "key-type", string(certs.ECP256), "key type: "+certs.KeyTypeNames(certs.KeyTypes))
	fl.Var(&f.ttl, "ttl", fmt.Sprintf("lifetime of the leaf (default %s, at most %s)", ca.DefaultTTL, ca.DefaultMaxTTL))
	fl.StringVar(&f.outCert, "out-cert", "-", "`file` for the chain (- = standard output)")
	fl.StringVar(&f.outKey, "out-key", "", "new `file` for the private key, created 0600 (required)")
	fl.StringVar(&f.outRoots, "out-roots", "", "`file` for the CA's roots (default: not written)")
	fl.BoolVar(&f.forceInsecure, "force-insecure-output", false, "write the key to standard output, over an existing path or into a directory others may write")
	for _, n := range []string{"id", "ca-dir", "out-key"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func runCertsLeaf(cmd *cobra.Command, f *certsLeafFlags) error {
	id, err := spiffeid.FromString(f.id)
	if err != nil {
		return cli.Usage(fmt.Errorf("certs leaf: --id %q: %v", f.id, err))
	}
	kt, err := certs.ParseKeyType(f.keyType)
	if err != nil {
		return cli.Usage(fmt.Errorf("certs leaf: --key-type %q: want one of %s", f.keyType, certs.KeyTypeNames(certs.KeyTypes)))
	}
	m, err := catool.Leaf(catool.LeafConfig{CADir: f.caDir, ID: id, TTL: time.Duration(f.ttl), KeyType: kt, Clock: certsClock})
	if err != nil {
		return err
	}
	out := catool.LeafOutput{Cert: f.outCert, Key: f.outKey, Roots: f.outRoots, ForceInsecure: f.forceInsecure, Stdout: cmd.OutOrStdout()}
	if err := catool.WriteLeaf(m, out); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "minted %s, serial %x, valid until %s\n", id, m.Leaf.SerialNumber, m.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}
