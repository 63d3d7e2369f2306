package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshid/meshid/ca/catool"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// certsClock is the time `meshid certs` starts certificates at; tests set
// a fake clock.
var certsClock clock.Clock = clock.Real{}

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
	cmd.AddCommand(newCertsRootCmd(), newCertsIntermediateCmd(), newCertsLeafCmd())
	cmd.AddCommand(newRotationCmds()...)
	return cmd
}

func newCertsRootCmd() *cobra.Command {
	var (
		cfg     catool.RootConfig
		keyType string
		ttl     = dayDuration(catool.DefaultCATTL)
	)
	cmd := &cobra.Command{
		Use:   "root --out DIR",
		Short: "Create a self-signed root CA: DIR/root-cert.pem and DIR/root-key.pem (0600)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl <= 0 {
				return errors.New("certs root: --ttl must be positive")
			}
			cfg.KeyType, cfg.TTL = certs.KeyType(keyType), time.Duration(ttl)
			cfg.Clock, cfg.Report = certsClock, cmd.OutOrStdout()
			_, err := catool.Root(cfg)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Dir, "out", "", "`directory` to write root-cert.pem and root-key.pem to (required)")
	fl.StringVar(&keyType, "key-type", string(certs.ECP256), "key type: "+certs.KeyTypeNames(certs.CAKeyTypes))
	fl.Var(&ttl, "ttl", "lifetime of the root (e.g. 87600h or 3650d)")
	fl.StringVar(&cfg.Org, "org", catool.DefaultRootOrg, "subject organization (O)")
	fl.StringVar(&cfg.CN, "cn", catool.DefaultRootCN, "subject common name (CN)")
	fl.BoolVar(&cfg.Force, "force", false, "overwrite an existing root-key.pem")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func newCertsIntermediateCmd() *cobra.Command {
	var (
		cfg          catool.IntermediateConfig
		keyType, key string
		ttl          = dayDuration(catool.DefaultCATTL)
	)
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("ttl") {
				if ttl <= 0 {
					return errors.New("certs intermediate: --ttl must be positive")
				}
				cfg.TTL = time.Duration(ttl)
			}
			uri, err := pkcs11.ParseOptionalURI(key)
			if err != nil {
				return fmt.Errorf("certs intermediate: --key %v (or no --key for a ca-key.pem file)", err)
			}
			cfg.KeyType, cfg.KeyURI = certs.KeyType(keyType), uri
			cfg.Clock, cfg.Report = certsClock, cmd.OutOrStdout()
			_, err = catool.Intermediate(cfg)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.RootDir, "root", "", "`directory` holding root-cert.pem and root-key.pem (required)")
	fl.StringVar(&cfg.Dir, "out", "", "`directory` to write the cacerts files to (required)")
	fl.StringVar(&cfg.Name, "name", "", "cluster name, the subject's L (required)")
	fl.StringVar(&keyType, "key-type", string(certs.ECP256), "key type: "+certs.KeyTypeNames(certs.CAKeyTypes))
	fl.Var(&ttl, "ttl", "lifetime of the intermediate (e.g. 87600h or 730d)")
	fl.StringVar(&cfg.Org, "org", "", "subject organization (O) (default: the root's)")
	fl.StringVar(&cfg.CN, "cn", catool.DefaultIntermediateCN, "subject common name (CN)")
	fl.BoolVar(&cfg.Force, "force", false, "overwrite an existing ca-key.pem")
	fl.BoolVar(&cfg.AllowOutlive, "allow-outlive", false, "allow an explicit --ttl that ends after the root expires")
	fl.StringVar(&key, "key", "", "where to create the intermediate's key: empty = DIR/ca-key.pem; a pkcs11: URI = in that PKCS#11 module (object= names the new key)")
	for _, n := range []string{"root", "out", "name"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}
