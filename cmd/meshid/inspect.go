package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/inspect"
	"github.com/meshid/meshid/internal/sdsfetch"
)

// inspectClock is the time `meshid inspect` checks validity at; tests set
// a fake clock so that golden output is stable.
var inspectClock clock.Clock = clock.Real{}

// Exit codes of `meshid inspect`, for scripts and monitoring.
const (
	exitInspectInvalid  = 2 // something is invalid or expired
	exitInspectExpiring = 3 // all valid, but something expires within --expires-within
)

// maxStdin bounds what inspect reads from standard input.
const maxStdin = 16 << 20

type inspectFlags struct {
	sds           string
	workloadAPI   string
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

Exit status: 0 all valid; 1 an input could not be read; 2 something is
invalid or expired; 3 all valid, but something expires within
--expires-within.`,
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
	fl.StringVar(&f.workloadAPI, "workload-api", "", "fetch the X.509-SVIDs and bundles of the SPIFFE Workload API on this Unix `socket`, as an application would")
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
	switch f.output {
	case "table", "json", "pem":
	default:
		return fmt.Errorf("inspect: unknown output format %q (want table, json or pem)", f.output)
	}
	if len(f.resources) != 0 && f.sds == "" {
		return errors.New("inspect: --resource needs --sds")
	}
	opts, err := inspectOptions(f)
	if err != nil {
		return err
	}
	inputs, err := inspectInputs(cmd, f, args)
	if err != nil {
		return err
	}
	inspect.PairKeys(inputs)

	rep := inspect.Check(inputs, opts)
	out := cmd.OutOrStdout()
	switch f.output {
	case "json":
		err = inspect.WriteJSON(out, rep)
	case "pem":
		err = inspect.WritePEM(out, inputs)
	default:
		err = inspect.WriteTable(out, rep, f.verbose)
	}
	if err != nil {
		return fmt.Errorf("inspect: write: %v", err)
	}
	return inspectExit(rep)
}

// inspectOptions are the checks of --expires-within, --trust-domain and
// --roots.
func inspectOptions(f *inspectFlags) (inspect.Options, error) {
	opts := inspect.Options{Now: inspectClock.Now(), ExpiresWithin: time.Duration(f.expiresWithin)}
	if f.trustDomain != "" {
		td, err := spiffeid.TrustDomainFromString(f.trustDomain)
		if err != nil {
			return opts, fmt.Errorf("inspect: --trust-domain: %v", err)
		}
		opts.TrustDomain = td
	}
	if f.roots != "" {
		in, err := loadOne(f.roots)
		if err != nil {
			return opts, err
		}
		if len(in.Certs) == 0 {
			return opts, fmt.Errorf("inspect: --roots %s: no certificates", f.roots)
		}
		opts.Roots, opts.RootsName = in.Certs, f.roots
	}
	return opts, nil
}

// inspectInputs reads what to inspect: the SDS resources of --sds, then
// each argument (a file, a directory, or - for standard input, the default
// when it is not a terminal).
func inspectInputs(cmd *cobra.Command, f *inspectFlags, args []string) ([]*inspect.Input, error) {
	var inputs []*inspect.Input
	if f.sds != "" {
		ins, err := sdsInputs(cmd, f)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, ins...)
	}
	if f.workloadAPI != "" {
		ins, err := inspect.FetchWorkloadAPI(cmd.Context(), f.workloadAPI, f.timeout)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, ins...)
	}
	if len(args) == 0 && f.sds == "" && f.workloadAPI == "" {
		if isTerminal(cmd.InOrStdin()) {
			return nil, errors.New("inspect: nothing to inspect: give FILE, DIR, - (standard input) or --sds SOCKET")
		}
		args = []string{"-"}
	}
	for _, arg := range args {
		if arg == "-" {
			data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxStdin))
			if err != nil {
				return nil, fmt.Errorf("inspect: stdin: %v", err)
			}
			in, err := inspect.ParsePEM("-", data)
			if err != nil {
				return nil, err
			}
			inputs = append(inputs, in)
			continue
		}
		ins, err := inspect.Load(arg)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, ins...)
	}
	return inputs, nil
}

// inspectExit maps the report to the documented exit status.
func inspectExit(rep *inspect.Report) error {
	bad, soon := 0, 0
	for _, r := range rep.Results {
		if !r.Valid {
			bad++
		}
		for _, p := range r.Problems {
			if p.Code == inspect.CodeExpiring {
				soon++
				break
			}
		}
	}
	switch rep.Status {
	case inspect.StatusInvalid:
		return &exitError{code: exitInspectInvalid, err: fmt.Errorf("inspect: %d of %d input(s) invalid", bad, len(rep.Results))}
	case inspect.StatusExpiring:
		return &exitError{code: exitInspectExpiring, err: fmt.Errorf("inspect: %d of %d input(s) expire within %s", soon, len(rep.Results), rep.ExpiresWithin)}
	}
	return nil
}

func loadOne(path string) (*inspect.Input, error) {
	ins, err := inspect.Load(path)
	if err != nil {
		return nil, err
	}
	if len(ins) != 1 {
		return nil, fmt.Errorf("inspect: %s: want a PEM file, not a directory", path)
	}
	return ins[0], nil
}

// sdsInputs fetches the SDS resources and turns them into inputs: a
// tls_certificate is a chain with its key, verified against the validation
// contexts fetched alongside (normally ROOTCA).
func sdsInputs(cmd *cobra.Command, f *inspectFlags) ([]*inspect.Input, error) {
	secrets, err := sdsfetch.Fetch(cmd.Context(), sdsfetch.Config{Socket: f.sds, Names: f.resources, Timeout: f.timeout})
	if err != nil {
		return nil, errors.New("inspect: SDS " + strings.TrimPrefix(err.Error(), "sdsfetch: "))
	}
	var (
		inputs    []*inspect.Input
		roots     []*x509.Certificate
		rootNames []string
	)
	for _, s := range secrets {
		switch s.Kind {
		case sdsfetch.KindTLSCertificate:
			inputs = append(inputs, &inspect.Input{Name: s.Name, Origin: inspect.OriginSDS, Certs: s.Chain, Key: s.Key})
		case sdsfetch.KindValidationContext:
			inputs = append(inputs, &inspect.Input{Name: s.Name, Origin: inspect.OriginSDS, Certs: s.Roots, Bundle: true})
			roots = append(roots, s.Roots...)
			rootNames = append(rootNames, s.Name)
		default:
			return nil, fmt.Errorf("inspect: SDS %s: resource %q holds no certificates (session ticket keys or a generic secret)", f.sds, s.Name)
		}
	}
	for _, in := range inputs {
		if !in.Bundle {
			in.Roots, in.RootsName = roots, strings.Join(rootNames, "+")
		}
	}
	return inputs, nil
}

// isTerminal reports whether r is an interactive terminal, in which case
// inspect does not wait for input nobody is going to type.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// dayDuration is a time.Duration flag that also takes whole days ("7d"),
// the unit certificate lifetimes are usually thought in.
type dayDuration time.Duration

func (d *dayDuration) String() string {
	if *d == 0 {
		return "0" // pflag's zero value: no "(default ...)" in the help
	}
	return time.Duration(*d).String()
}

func (d *dayDuration) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil {
			return fmt.Errorf("invalid duration %q", s)
		}
		*d = dayDuration(time.Duration(n) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	*d = dayDuration(v)
	return nil
}

func (d *dayDuration) Type() string { return "duration" }
