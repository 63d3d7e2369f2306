package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/inspect"
	"github.com/meshid/meshid/internal/sdsfetch"
)

// inspectClock is the time `meshid inspect` checks validity at; tests set
// a fake clock so that golden output is stable.
var inspectClock clock.Clock = clock.Real{}

// Exit codes of `meshid inspect`, for scripts and monitoring.
const (
	exitInspectExpiring = 3 // all valid, but something expires within --expires-within
	exitInspectInvalid  = 4 // something is invalid or expired
)

type inspectFlags struct {
	sds           string
	resources     []string
	roots         string
	output        string
	expiresWithin dayDuration
	verbose       bool
	timeout       time.Duration
	trustDomain   string
}

func newInspectCmd() *cobra.Command {
	f := &inspectFlags{}
	cmd := &cobra.Command{
		Use:   "inspect [FILE|DIR|- ...]",
		Short: "Show and verify certificates, keys, CSRs, CA directories or a proxy's SDS secrets",
		Long: `meshid inspect answers: what is being served, is it valid, and when does it expire?

Inputs are PEM (or DER) files holding certificates, a chain, a key or a CSR;
"-" or piped standard input; a CA directory in the Istio cacerts layout
(ca-cert.pem ca-key.pem cert-chain.pem root-cert.pem), the Kubernetes TLS
layout (tls.crt tls.key ca.crt) or a root from "meshid certs root"; and, with
--sds, the secrets an SDS server hands a proxy ("default" and "ROOTCA" unless
--resource names others). It works against any SDS server.

Chains are verified against --roots, else against the roots of their CA
directory or ROOTCA from SDS. Every failure is named: expired (with the time),
not yet valid, unknown issuer, name mismatch, key/cert mismatch, non-SPIFFE
leaf.

Exit status: 0 all valid; 1 an input could not be read; 2 a usage error
(unknown flag, bad value); 3 all valid, but something expires within
--expires-within; 4 something is invalid or expired.`,
		Example: `  meshid inspect --sds ./var/run/secrets/workload-spiffe-uds/socket
  meshid inspect --roots root-cert.pem cert-chain.pem
  meshid inspect ./cacerts/west -o json
  kubectl get secret cacerts -o jsonpath='{.data.ca-cert\.pem}' | base64 -d | meshid inspect -
  meshid inspect --sds sds.sock --resource ROOTCA -o pem > root-cert.pem
  meshid inspect cert.pem --expires-within 168h || alert`,
		RunE: func(cmd *cobra.Command, args []string) error { return runInspect(cmd, f, args) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.sds, "sds", "", "fetch secrets from the SDS server on this Unix `socket`, as a proxy would")
	fl.StringSliceVar(&f.resources, "resource", nil, "SDS resource `name` to fetch (repeatable; default: default,ROOTCA)")
	fl.StringVar(&f.roots, "roots", "", "verify chains against the trusted roots in this PEM `file`")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table, json or pem")
	fl.Var(&f.expiresWithin, "expires-within", "exit 3 if anything expires within this `duration` (e.g. 24h, 7d)")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "show every certificate's details under the table")
	fl.DurationVar(&f.timeout, "timeout", sdsfetch.DefaultTimeout, "how long to wait for the SDS server")
	fl.StringVar(&f.trustDomain, "trust-domain", "", "require leaves to be in this trust `domain` (default: any)")
	return cmd
}

func runInspect(cmd *cobra.Command, f *inspectFlags, args []string) error {
	format, err := inspect.ParseFormat(f.output)
	if err != nil {
		return cli.Usage(err)
	}
	if len(f.resources) != 0 && f.sds == "" {
		return cli.Usage(errors.New("inspect: --resource needs --sds"))
	}
	cfg := inspect.Config{
		Paths: args, Stdin: cmd.InOrStdin(), RootsFile: f.roots,
		Options: inspect.Options{Now: inspectClock.Now(), ExpiresWithin: time.Duration(f.expiresWithin)},
		Format:  format, Verbose: f.verbose, Out: cmd.OutOrStdout(),
	}
	if f.trustDomain != "" {
		td, err := spiffeid.TrustDomainFromString(f.trustDomain)
		if err != nil {
			return cli.Usage(fmt.Errorf("inspect: --trust-domain: %v", err))
		}
		cfg.Options.TrustDomain = td
	}
	if f.sds != "" {
		cfg.Sources = append(cfg.Sources, inspect.SDS(sdsfetch.Config{Socket: f.sds, Names: f.resources, Timeout: f.timeout}))
	}
	rep, err := inspect.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	code := map[inspect.Status]int{inspect.StatusInvalid: exitInspectInvalid, inspect.StatusExpiring: exitInspectExpiring}[rep.Status]
	if err := rep.Err(); err != nil {
		return &cli.ExitCodeError{Code: code, Err: err}
	}
	return nil
}
