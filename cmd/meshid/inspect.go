package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/inspect"
	"github.com/meshid/meshid/inspect/podagent"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsfetch"
	"github.com/meshid/meshid/sds/secretdump"
)

// inspectClock is the time `meshid inspect` checks validity at; tests set
// a fake clock so that golden output is stable.
var inspectClock clock.Clock = clock.Real{}

type inspectFlags struct {
	sds           string
	workloadAPI   string
	resources     []string
	roots         string
	output        *cli.Output
	expiresWithin dayDuration
	verbose       bool
	timeout       time.Duration
	trustDomain   string
	pod           string
	container     string
	kubeconfig    string
	allowDNS      bool
	ca            string
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
--resource names others). It works against any SDS server. With --pod, it
reads the chain and roots the meshid agent of a pod holds (never its key),
through the API server, like "istioctl proxy-config secret".

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
  meshid inspect cert.pem --expires-within 168h || alert
  meshid inspect --pod shop/cart-7d9f --container meshid-agent`,
		RunE: func(cmd *cobra.Command, args []string) error { return runInspect(cmd, f, args) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.sds, "sds", "", "fetch secrets from the SDS server on this Unix `socket`, as a proxy would")
	fl.StringVar(&f.workloadAPI, "workload-api", "", "fetch the X.509-SVIDs, bundles and JWT bundles of the SPIFFE Workload API on this Unix `socket`, as an application would")
	fl.StringSliceVar(&f.resources, "resource", nil, "SDS resource `name` to fetch (repeatable; default: default,ROOTCA)")
	fl.StringVar(&f.roots, "roots", "", "verify chains against the trusted roots in this PEM `file`")
	f.output = cli.OutputFlag(fl, cli.OutputTable, cli.OutputJSON, cli.OutputPEM)
	fl.Var(&f.expiresWithin, "expires-within", "exit 3 if anything expires within this `duration` (e.g. 24h, 7d)")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "show every certificate's details under the table")
	fl.DurationVar(&f.timeout, "timeout", sdsfetch.DefaultTimeout, "how long to wait for the SDS server or the pod's agent")
	fl.StringVar(&f.trustDomain, "trust-domain", "", "require leaves to be in this trust `domain` (default: any)")
	fl.BoolVar(&f.allowDNS, "allow-dns", false, "accept leaves named by DNS SANs without a SPIFFE ID (gateway certificates); their chains are still verified")
	fl.StringVar(&f.pod, "pod", "", "read what the meshid agent of pod `NS/NAME` holds, through the API server (a port-forward to its /debug/secrets)")
	fl.StringVar(&f.container, "container", podagent.DefaultContainer, "with --pod: the agent's container `name`")
	fl.StringVar(&f.ca, "ca", "", "print the CA's rotation state (phase, signing CA, trust bundle with expiries, next step) from the server's --admin-socket `socket`")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "with --pod: kubeconfig `file` (default: $KUBECONFIG, then ~/.kube/config)")
	return cmd
}

func runInspect(cmd *cobra.Command, f *inspectFlags, args []string) error {
	format, err := inspect.ParseFormat(f.output.String())
	if err != nil {
		return cli.Usage(err)
	}
	if f.ca != "" {
		if len(args) != 0 || f.sds != "" || f.workloadAPI != "" || f.pod != "" {
			return cli.Usage(errors.New("inspect: --ca reads a running CA's admin socket; give it alone"))
		}
		return inspectCA(cmd, f.ca, format, f.timeout)
	}
	if len(f.resources) != 0 && f.sds == "" {
		return cli.Usage(errors.New("inspect: --resource needs --sds"))
	}
	cfg := inspect.Config{
		Paths: args, Stdin: cmd.InOrStdin(), RootsFile: f.roots,
		Options: inspect.Options{Now: inspectClock.Now(), ExpiresWithin: time.Duration(f.expiresWithin), AllowDNS: f.allowDNS},
		Format:  format, Verbose: f.verbose, Out: cmd.OutOrStdout(),
		// Colour and the narrow table only for a person at a terminal
		// (https://no-color.org: NO_COLOR turns both off).
		Terminal: inspect.IsTerminal(cmd.OutOrStdout()) && os.Getenv("NO_COLOR") == "",
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
	if f.pod != "" {
		src, err := podSource(f)
		if err != nil {
			return err
		}
		cfg.Sources = append(cfg.Sources, src)
	}
	if f.workloadAPI != "" {
		cfg.Sources = append(cfg.Sources, inspect.WorkloadAPI(f.workloadAPI, f.timeout))
		cfg.JWTSources = append(cfg.JWTSources, inspect.WorkloadAPIJWT(f.workloadAPI, f.timeout))
	}
	rep, err := inspect.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if err := rep.Err(); err != nil {
		return &cli.ExitCodeError{Code: rep.ExitCode(), Err: err}
	}
	return nil
}

// podSource is the Source of --pod NS/NAME: the agent's /debug/secrets
// through a port-forward.
func podSource(f *inspectFlags) (inspect.Source, error) {
	ns, name, err := podagent.ParseRef(f.pod)
	if err != nil {
		return nil, cli.Usage(fmt.Errorf("inspect: --pod %v", err))
	}
	rc, err := podagent.LoadREST(f.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("inspect: --pod needs a cluster (--kubeconfig): %v", err)
	}
	a, err := podagent.New(podagent.Config{REST: rc, Namespace: ns, Pod: name, Container: f.container, Timeout: f.timeout, MaxBody: secretdump.MaxSize})
	if err != nil {
		return nil, err
	}
	return inspect.AgentDump("pod "+f.pod, func(ctx context.Context) ([]byte, error) { return a.Get(ctx, secretdump.Path) }), nil
}

// inspectCA prints where the CA's rotation stands, read from the running
// server's admin socket (ca/admin): the same answer as `meshid certs status`.
func inspectCA(cmd *cobra.Command, socket string, format inspect.Format, timeout time.Duration) error {
	st, err := admin.NewClient(socket, timeout).Status(cmd.Context())
	if err != nil {
		return fmt.Errorf("inspect: --ca %s: %w", socket, err)
	}
	return st.Print(cmd.OutOrStdout(), inspectClock.Now(), format == inspect.FormatJSON)
}
