package inspect

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/meshid/meshid/sds/sdsfetch"
)

// MaxStdin bounds what Run reads from standard input.
const MaxStdin = 16 << 20

// Format is an output format of Run.
type Format string

// Output formats.
const (
	FormatTable Format = "table"
	FormatJSON  Format = "json"
	FormatPEM   Format = "pem"
)

// ParseFormat accepts table, json or pem.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case FormatTable, FormatJSON, FormatPEM:
		return f, nil
	}
	return "", fmt.Errorf("inspect: unknown output format %q (want table, json or pem)", s)
}

// Source fetches served secrets as inputs: an SDS server (SDS), or the
// agent of a pod (cmd/meshid's --pod).
type Source func(ctx context.Context) ([]*Input, error)

// Config is one inspection: what to read, how to check it, how to print.
type Config struct {
	// Sources are read first, in order (--sds, --pod).
	Sources []Source
	// JWTSources add JWT bundle keys to the report (--workload-api): a
	// table of their own under the certificates', jwt_bundles in JSON.
	JWTSources []JWTSource
	// Paths are files, CA directories or "-" for Stdin. Empty with no
	// Sources means "-" unless Stdin is an interactive terminal.
	Paths []string
	Stdin io.Reader
	// RootsFile, when set, is a PEM file of roots every chain is verified
	// against (--roots); it overrides Options.Roots.
	RootsFile string
	Options   Options
	Format    Format // default table
	Verbose   bool   // table: every certificate's details
	// Terminal draws the table for a person (TableStyle.Terminal): set it
	// only when Out is a terminal.
	Terminal bool
	Out      io.Writer
}

// Run reads the inputs, checks them and writes the report to cfg.Out. The
// report's Status is the verdict; Err turns it into an error for the exit
// status.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Format == "" {
		cfg.Format = FormatTable
	}
	if _, err := ParseFormat(string(cfg.Format)); err != nil {
		return nil, err
	}
	if cfg.RootsFile != "" {
		roots, err := LoadRoots(cfg.RootsFile)
		if err != nil {
			return nil, err
		}
		cfg.Options.Roots, cfg.Options.RootsName = roots, cfg.RootsFile
	}
	inputs, err := gather(ctx, cfg)
	if err != nil {
		return nil, err
	}
	PairKeys(inputs)
	rep := Check(inputs, cfg.Options)
	for _, src := range cfg.JWTSources {
		keys, err := src(ctx)
		if err != nil {
			return nil, err
		}
		rep.JWTBundles = append(rep.JWTBundles, keys...)
	}
	switch cfg.Format {
	case FormatJSON:
		err = WriteJSON(cfg.Out, rep)
	case FormatPEM:
		err = WritePEM(cfg.Out, inputs)
	default:
		err = WriteTableStyle(cfg.Out, rep, TableStyle{Verbose: cfg.Verbose, Terminal: cfg.Terminal})
		if err == nil && len(rep.JWTBundles) > 0 {
			if _, err = io.WriteString(cfg.Out, "\n"); err == nil {
				err = WriteJWTKeys(cfg.Out, rep.JWTBundles)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: write: %v", err)
	}
	return rep, nil
}

// gather reads the sources, then each path (a file, a directory, or - for
// standard input, the default when it is not a terminal).
func gather(ctx context.Context, cfg Config) ([]*Input, error) {
	var inputs []*Input
	for _, src := range cfg.Sources {
		ins, err := src(ctx)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, ins...)
	}
	paths := cfg.Paths
	if len(paths) == 0 && len(cfg.Sources) == 0 {
		if IsTerminal(cfg.Stdin) {
			return nil, errors.New("inspect: nothing to inspect: give FILE, DIR, - (standard input), --sds SOCKET, --workload-api SOCKET or --pod NS/NAME")
		}
		paths = []string{"-"}
	}
	for _, p := range paths {
		if p != "-" {
			ins, err := Load(p)
			if err != nil {
				return nil, err
			}
			inputs = append(inputs, ins...)
			continue
		}
		if cfg.Stdin == nil {
			return nil, errors.New("inspect: stdin: no standard input")
		}
		data, err := io.ReadAll(io.LimitReader(cfg.Stdin, MaxStdin))
		if err != nil {
			return nil, fmt.Errorf("inspect: stdin: %v", err)
		}
		in, err := ParsePEM("-", data)
		if err != nil {
			return nil, err
		}
		inputs = append(inputs, in)
	}
	return inputs, nil
}

// LoadRoots reads a PEM file of trusted roots.
func LoadRoots(path string) ([]*x509.Certificate, error) {
	ins, err := Load(path)
	if err != nil {
		return nil, err
	}
	if len(ins) != 1 {
		return nil, fmt.Errorf("inspect: %s: want a PEM file, not a directory", path)
	}
	if len(ins[0].Certs) == 0 {
		return nil, fmt.Errorf("inspect: --roots %s: no certificates", path)
	}
	return ins[0].Certs, nil
}

// Exit statuses of `meshid inspect` beyond the CLI's 0, 1 and 2, for
// scripts and monitoring.
const (
	ExitExpiring = 3 // all valid, but something expires within the window
	ExitInvalid  = 4 // something is invalid or expired
)

// ExitCode is the exit status the report calls for: 0, ExitExpiring or
// ExitInvalid.
func (r *Report) ExitCode() int {
	switch r.Status {
	case StatusInvalid:
		return ExitInvalid
	case StatusExpiring:
		return ExitExpiring
	}
	return 0
}

// Err is nil when every input is valid and none expires within the
// window; otherwise it says how many are invalid or expiring.
func (r *Report) Err() error {
	bad, soon := 0, 0
	for _, res := range r.Results {
		if !res.Valid {
			bad++
		}
		for _, p := range res.Problems {
			if p.Code == CodeExpiring {
				soon++
				break
			}
		}
	}
	switch r.Status {
	case StatusInvalid:
		return fmt.Errorf("inspect: %d of %d input(s) invalid", bad, len(r.Results))
	case StatusExpiring:
		return fmt.Errorf("inspect: %d of %d input(s) expire within %s", soon, len(r.Results), r.ExpiresWithin)
	}
	return nil
}

// SDS is the Source of an SDS server: a tls_certificate is a chain with its
// key, verified against the validation contexts fetched alongside
// (normally ROOTCA).
func SDS(cfg sdsfetch.Config) Source {
	return func(ctx context.Context) ([]*Input, error) {
		secrets, err := sdsfetch.Fetch(ctx, cfg)
		if errors.Is(err, sdsfetch.ErrNotSDS) {
			if kind := socketKind(ctx, cfg.Socket); kind != "" {
				return nil, fmt.Errorf("inspect: SDS %s: not an SDS server: this is %s", cfg.Socket, kind)
			}
		}
		if err != nil {
			return nil, errors.New("inspect: SDS " + strings.TrimPrefix(err.Error(), "sdsfetch: "))
		}
		served := make([]Served, 0, len(secrets))
		for _, s := range secrets {
			switch s.Kind {
			case sdsfetch.KindTLSCertificate:
				served = append(served, Served{Name: s.Name, Chain: s.Chain, Key: s.Key})
			case sdsfetch.KindValidationContext:
				served = append(served, Served{Name: s.Name, Roots: s.Roots})
			default:
				return nil, fmt.Errorf("inspect: SDS %s: resource %q holds no certificates (session ticket keys or a generic secret)", cfg.Socket, s.Name)
			}
		}
		return ServedInputs(served), nil
	}
}

// Served is one secret a proxy is served: a certificate chain (with its
// key, when the source hands keys out) or a bundle of roots.
type Served struct {
	Name  string
	Chain []*x509.Certificate
	Key   crypto.Signer // nil when the source never hands keys out
	Roots []*x509.Certificate
}

// ServedInputs turns served secrets into inputs: each chain is verified
// against every bundle served alongside it.
func ServedInputs(served []Served) []*Input {
	var (
		inputs    []*Input
		roots     []*x509.Certificate
		rootNames []string
	)
	for _, s := range served {
		if s.Chain != nil {
			inputs = append(inputs, &Input{Name: s.Name, Origin: OriginSDS, Certs: s.Chain, Key: s.Key})
			continue
		}
		inputs = append(inputs, &Input{Name: s.Name, Origin: OriginSDS, Certs: s.Roots, Bundle: true})
		roots = append(roots, s.Roots...)
		rootNames = append(rootNames, s.Name)
	}
	for _, in := range inputs {
		if !in.Bundle {
			in.Roots, in.RootsName = roots, strings.Join(rootNames, "+")
		}
	}
	return inputs
}

// IsTerminal reports whether r is an interactive terminal, in which case
// inspect does not wait for input nobody is going to type.
func IsTerminal(r any) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
