package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/bench/caload"
	"github.com/meshid/meshid/bench/chart"
	"github.com/meshid/meshid/bench/cputime"
	"github.com/meshid/meshid/bench/cryptobound"
	"github.com/meshid/meshid/bench/latency"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/devissuer"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "meshid-bench",
		Short:         "Load a CA or an agent and report throughput, latency and memory",
		SilenceUsage:  true,
		SilenceErrors: true,
		Long: `meshid-bench measures a running meshid (or any Istio-compatible) CA or agent.
It is a tool, not part of the production binaries (it links the charts).

  ca    CreateCertificate load: certificates/s, latency p50/p90/p99/max,
              errors by gRPC code; --sweep runs several concurrency levels and
              --chart draws throughput against concurrency.
  sds   N SDS streams against an agent's socket: time until each stream
              holds default and ROOTCA, the agent's RSS, and with --rotate the
              time for a forced rotation to reach every stream.

Progress goes to standard error once a second; the report (a table, or JSON
with -o json) goes to standard output.`,
	}
	cmd.AddCommand(newBenchCACmd(), newBenchSDSCmd(), newBenchFloodCmd())
	// A wrong command line (a bad -o among them) exits 2, as meshid's.
	cli.MarkUsageErrors(cmd)
	return cmd
}

type benchCAFlags struct {
	addr, caRoot, serverName     string
	tokenFile, devStateDir       string
	namespace, trustDomain       string
	audience, keyType, clusterID string
	sweep, chart                 string
	output                       *cli.Output
	serviceAccounts, concurrency int
	requests, connections        int
	duration, timeout, ttl       time.Duration
	pregen, quiet, cryptoBound   bool
	caKeyType                    string
	boundDuration                time.Duration
	caPID                        int
	kubeconfig                   string
	freshTokens                  int
	cpuProfile                   string
}

func newBenchCACmd() *cobra.Command {
	f := &benchCAFlags{}
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Load a CA with CreateCertificate calls",
		Long: `meshid-bench ca sends CreateCertificate requests (istio.v1.auth.IstioCertificateService)
over TLS, each with a CSR for the caller's identity and its bearer token, like ghz but CSR-aware.

Tokens come from --token-file (one identity, read from the token's kubernetes.io
claims), or from --dev-state-dir: the state directory of a running "meshid dev",
whose offline issuer mints tokens for --service-accounts distinct service accounts
bench-0..N-1 in --namespace, each request using its own account's token and a CSR
for that identity.

--pregen-keys makes one key and CSR per service account before the clock starts,
so client key generation is not measured; without it every request generates a
fresh key, as an agent does, on the same CPUs as the CA when both run here.
Latency percentiles cover successful requests.`,
		Example: `  meshid-bench ca --dev-state-dir .meshid-dev --pregen-keys --duration 10s
  meshid-bench ca --dev-state-dir .meshid-dev --service-accounts 100 --pregen-keys --requests 5000 -o json
  meshid-bench ca --dev-state-dir .meshid-dev --pregen-keys --duration 5s --sweep 1,8,64 --chart docs/ca-throughput.svg
  meshid-bench ca --addr istiod.istio-system.svc:15012 --ca-root root-cert.pem --token-file ./var/run/secrets/tokens/istio-token`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchCA(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:15012", "the CA's gRPC `address`")
	fl.StringVar(&f.caRoot, "ca-root", "", "PEM `file` of the roots that verify the CA's serving certificate (default <dev-state-dir>/root-cert.pem)")
	fl.StringVar(&f.serverName, "server-name", "", "TLS server name to verify (default: the host of --addr; a host containing localhost becomes istiod.istio-system.svc, as Istio's agent does)")
	fl.StringVar(&f.tokenFile, "token-file", "", "bearer token `file` of one service account")
	fl.StringVar(&f.devStateDir, "dev-state-dir", "", "state `dir` of a running meshid dev: mint tokens for --service-accounts accounts with its issuer")
	fl.IntVar(&f.serviceAccounts, "service-accounts", 1, "with --dev-state-dir: number of distinct service accounts bench-0..N-1")
	fl.StringVar(&f.namespace, "namespace", "bench", "with --dev-state-dir: namespace of the service accounts")
	fl.StringVar(&f.audience, "audience", "istio-ca", "with --dev-state-dir: audience of the minted tokens")
	fl.StringVar(&f.trustDomain, "trust-domain", "cluster.local", "trust domain of the requested SPIFFE IDs")
	fl.IntVar(&f.concurrency, "concurrency", caload.DefaultConcurrency, "requests in flight")
	fl.DurationVar(&f.duration, "duration", caload.DefaultDuration, "length of a run (unless --requests is set)")
	fl.IntVar(&f.requests, "requests", 0, "number of requests of a run (0: run for --duration)")
	fl.StringVar(&f.keyType, "key-type", string(certs.ECP256), "leaf key type: "+certs.KeyTypeNames(certs.KeyTypes))
	fl.BoolVar(&f.pregen, "pregen-keys", false, "generate one key and CSR per service account before measuring")
	fl.StringVar(&f.sweep, "sweep", "", "comma-separated concurrency `levels` (e.g. 1,2,4,8,16,32,64): one run and one row per level")
	fl.StringVar(&f.chart, "chart", "", "write a throughput-vs-concurrency chart to this .svg or .png `file`")
	fl.IntVar(&f.connections, "connections", 1, "gRPC connections to spread the requests over")
	fl.DurationVar(&f.ttl, "ttl", 0, "requested certificate validity (0: the CA's default)")
	fl.StringVar(&f.clusterID, "cluster-id", "", "ClusterID sent in the request metadata, as Istio's agent does")
	fl.DurationVar(&f.timeout, "timeout", caload.DefaultTimeout, "timeout of each request")
	fl.BoolVar(&f.cryptoBound, "crypto-bound", false, "first measure the in-process raw crypto bound (CSR signature check + CA signature, on every CPU) and report throughput as a fraction of it")
	fl.DurationVar(&f.boundDuration, "crypto-bound-duration", cryptobound.DefaultDuration, "how long --crypto-bound measures")
	fl.StringVar(&f.caKeyType, "ca-key-type", "", "CA key type for --crypto-bound (default: the key type of the --ca-root certificate)")
	fl.IntVar(&f.caPID, "ca-pid", 0, "the CA's `pid` on this machine: report its CPU time per certificate (and, with --crypto-bound, the bound's share of it)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "with --fresh-tokens: kubeconfig `file` of a user who may create pods and tokens in --namespace and read the API server's /metrics")
	fl.IntVar(&f.freshTokens, "fresh-tokens", 0, "before the clock starts, create `N` pods (spec.nodeName set) in --namespace and mint one pod-bound token each (TokenRequest); then send one CSR per token and report the API server's requests during the run (apiserver_request_total by resource)")
	f.output = cli.OutputFlag(fl, cli.OutputTable, cli.OutputJSON)
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress lines on standard error")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of this load tool during the measured runs to `file` (go tool pprof)")
	return cmd
}

// benchCAResult is the JSON document of `bench ca -o json`.
type benchCAResult struct {
	Addr        string           `json:"addr"`
	CryptoBound *benchBound      `json:"crypto_bound,omitempty"`
	Runs        []*caload.Report `json:"runs"`
	// APIServerRequests are the API server's requests during a
	// --fresh-tokens run, by resource ("" for non-resource URLs).
	APIServerRequests map[string]float64 `json:"apiserver_requests,omitempty"`
}

// benchBound is the in-process raw crypto bound and the best run's share of it.
type benchBound struct {
	LeafKeyType    string  `json:"leaf_key_type"`
	CAKeyType      string  `json:"ca_key_type"`
	Workers        int     `json:"workers"`
	CertsPerSecond float64 `json:"certs_per_second"`
	BestRatio      float64 `json:"best_ratio"` // best run's certs/s over the bound
	// CPU time per pair of the bound, and (with --ca-pid) the best run's
	// ratio of it to the CA's CPU per certificate, alone and with the
	// load's CPU added. Unlike BestRatio, these do not depend on how much
	// of the machine other processes leave to the CA and to the bound.
	CPUMicros            float64 `json:"cpu_us_per_cert,omitempty"`
	BestCPURatio         float64 `json:"best_cpu_ratio,omitempty"`
	BestCPURatioWithLoad float64 `json:"best_cpu_ratio_with_load,omitempty"`
	cpu                  time.Duration
}

func runBenchCA(cmd *cobra.Command, f *benchCAFlags) error {
	kt, err := certs.ParseKeyType(f.keyType)
	if err != nil {
		return fmt.Errorf("bench ca: %w", err)
	}
	levels := []int{f.concurrency}
	if f.sweep != "" {
		if levels, err = parseLevels(f.sweep); err != nil {
			return err
		}
	}
	if f.chart != "" {
		if _, err := chart.FormatOf(f.chart); err != nil {
			return fmt.Errorf("bench ca: --chart: %w", err)
		}
	}
	if f.connections < 1 {
		return errors.New("bench ca: --connections must be at least 1")
	}
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return fmt.Errorf("bench ca: --trust-domain: %w", err)
	}
	runFor := time.Duration(len(levels)) * f.duration
	var (
		ids    []caload.Identity
		caRoot string
		fresh  *freshRun
	)
	if f.freshTokens > 0 {
		ids, fresh, err = prepareFresh(cmd.Context(), f, td, cmd.ErrOrStderr())
		caRoot = f.caRoot
	} else {
		ids, caRoot, err = benchIdentities(f, td, time.Hour+2*runFor)
	}
	if err != nil {
		return err
	}
	tlsCfg, err := benchTLS(caRoot, f.addr, f.serverName)
	if err != nil {
		return err
	}
	clients := make([]caload.Client, f.connections)
	for i := range clients {
		conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
		if err != nil {
			return fmt.Errorf("bench ca: %w", err)
		}
		defer conn.Close()
		clients[i] = securityapi.NewIstioCertificateServiceClient(conn)
	}

	stderr := cmd.ErrOrStderr()
	progress := func(p caload.Progress) {
		fmt.Fprintf(stderr, "bench ca: concurrency %d  %5.0fs  %d done  %d errors  %.0f req/s\n",
			p.Concurrency, p.Elapsed.Seconds(), p.Done, p.Done-p.OK, p.Rate)
	}
	if f.quiet {
		progress = nil
	}
	l, err := caload.New(caload.Config{
		Clients: clients, Identities: ids, KeyType: kt, Pregen: f.pregen,
		Concurrency: f.concurrency, Requests: f.requests, Duration: f.duration,
		TTL: f.ttl, ClusterID: f.clusterID, Timeout: f.timeout, Progress: progress,
		ClientCPU: cputime.Self, ServerCPU: serverCPU(f.caPID),
	})
	if err != nil {
		return fmt.Errorf("bench ca: %w", err)
	}
	ctx := cmd.Context()
	if f.pregen {
		if !f.quiet {
			fmt.Fprintf(stderr, "bench ca: generating %d %s key(s) and CSR(s)\n", len(ids), kt)
		}
		if err := l.Prepare(ctx); err != nil {
			return fmt.Errorf("bench ca: %w", err)
		}
	}
	if !f.quiet {
		what := fmt.Sprintf("for %s", f.duration)
		if f.requests > 0 {
			what = fmt.Sprintf("%d requests", f.requests)
		}
		fmt.Fprintf(stderr, "bench ca: %s, %d identit(ies), %s keys, concurrency %s, %s\n",
			f.addr, len(ids), kt, joinInts(levels), what)
	}
	var bound *benchBound
	if f.cryptoBound {
		if bound, err = measureBound(ctx, f, kt, caRoot, stderr); err != nil {
			return err
		}
	}
	if fresh != nil {
		if err := fresh.start(ctx); err != nil {
			return fmt.Errorf("bench ca: %w", err)
		}
	}
	stopProfile, err := startCPUProfile(f.cpuProfile)
	if err != nil {
		return err
	}
	reports, runErr := l.Sweep(ctx, levels)
	if err := stopProfile(); err != nil {
		return err
	}
	if len(reports) == 0 && runErr != nil {
		return fmt.Errorf("bench ca: %w", runErr)
	}
	var apiRequests map[string]float64
	if fresh != nil {
		if apiRequests, err = fresh.finish(ctx); err != nil {
			return fmt.Errorf("bench ca: %w", err)
		}
	}
	if bound != nil {
		for _, r := range reports {
			bound.BestRatio = max(bound.BestRatio, math.Round(r.Throughput/bound.CertsPerSecond*1000)/1000)
			if ca := r.CPUPerCert(r.ServerCPU); ca > 0 && bound.cpu > 0 {
				bound.BestCPURatio = max(bound.BestCPURatio, math.Round(float64(bound.cpu)/float64(ca)*1000)/1000)
				all := ca + r.CPUPerCert(r.ClientCPU)
				bound.BestCPURatioWithLoad = max(bound.BestCPURatioWithLoad, math.Round(float64(bound.cpu)/float64(all)*1000)/1000)
			}
		}
	}
	out := cmd.OutOrStdout()
	if f.output.Is(cli.OutputJSON) {
		err = writeJSON(out, benchCAResult{Addr: f.addr, CryptoBound: bound, Runs: reports, APIServerRequests: apiRequests})
	} else {
		err = caload.WriteTable(out, reports)
		if err == nil && fresh != nil {
			_, err = fmt.Fprintf(out, "API server requests during the run: %s\n", formatRequests(apiRequests, f.requests))
		}
		if err == nil && bound != nil {
			_, err = fmt.Fprintf(out, "in-process crypto bound: %.1f certs/s (%s CSR check + %s CA signature, %d CPUs); best run: %.1f%% of it\n",
				bound.CertsPerSecond, bound.LeafKeyType, bound.CAKeyType, bound.Workers, 100*bound.BestRatio)
			if err == nil && bound.BestCPURatio > 0 {
				_, err = fmt.Fprintf(out, "CPU per certificate: crypto bound %s; best run: the bound is %.1f%% of the CA's CPU per certificate, %.1f%% of the CA's and the load's together\n",
					latency.Format(bound.cpu), 100*bound.BestCPURatio, 100*bound.BestCPURatioWithLoad)
			}
		}
	}
	if err != nil {
		return err
	}
	if f.chart != "" {
		pts := make([]chart.Point, len(reports))
		for i, r := range reports {
			pts[i] = chart.Point{Concurrency: r.Concurrency, Throughput: r.Throughput}
		}
		c := chart.Chart{
			Title:  fmt.Sprintf("meshid CA: CreateCertificate throughput, %s leaf keys", kt),
			Series: []chart.Series{{Name: string(kt), Points: pts}},
		}
		if bound != nil {
			c.Bound, c.BoundName = bound.CertsPerSecond, "in-process crypto bound"
		}
		if err := chart.Save(f.chart, c); err != nil {
			return fmt.Errorf("bench ca: %w", err)
		}
		if !f.quiet {
			fmt.Fprintf(stderr, "bench ca: wrote %s\n", f.chart)
		}
	}
	if runErr != nil {
		return fmt.Errorf("bench ca: %w", runErr)
	}
	for _, r := range reports {
		if r.Requests > 0 && r.OK == 0 {
			return fmt.Errorf("bench ca: no request succeeded at concurrency %d (%s)", r.Concurrency, caload.FormatErrors(r.Errors))
		}
	}
	return nil
}

// measureBound measures the in-process raw crypto bound for leaf keys of
// type leaf and the CA's key type (--ca-key-type, else that of the first
// certificate in caRoot).
func measureBound(ctx context.Context, f *benchCAFlags, leaf certs.KeyType, caRoot string, stderr io.Writer) (*benchBound, error) {
	caKT := certs.KeyType(f.caKeyType)
	if caKT == "" {
		pemData, err := os.ReadFile(caRoot)
		if err != nil {
			return nil, fmt.Errorf("bench ca: CA root: %w", err)
		}
		roots, err := certs.ParseCertificates(pemData)
		if err != nil {
			return nil, fmt.Errorf("bench ca: CA root %s: %w", caRoot, err)
		}
		caKT = certs.KeyType(certs.KeyTypeOf(roots[0].PublicKey))
	}
	if _, err := certs.ParseKeyType(string(caKT)); err != nil {
		return nil, fmt.Errorf("bench ca: CA key type: %w", err)
	}
	if !f.quiet {
		fmt.Fprintf(stderr, "bench ca: measuring the in-process crypto bound (%s CSR check + %s CA signature) for %s\n", leaf, caKT, f.boundDuration)
	}
	res, err := cryptobound.Measure(ctx, cryptobound.Config{LeafKeyType: leaf, CAKeyType: caKT, Duration: f.boundDuration, CPU: cputime.Self})
	if err != nil {
		return nil, fmt.Errorf("bench ca: %w", err)
	}
	return &benchBound{LeafKeyType: string(leaf), CAKeyType: string(caKT), Workers: res.Workers,
		CertsPerSecond: math.Round(res.PerSecond*10) / 10,
		CPUMicros:      math.Round(float64(res.CPUPerOp.Nanoseconds())/100) / 10, cpu: res.CPUPerOp}, nil
}

// serverCPU reads the CA's CPU time when its pid is known.
func serverCPU(pid int) func() (time.Duration, error) {
	if pid <= 0 {
		return nil
	}
	return cputime.Of(pid)
}

// benchIdentities returns the identities of the load and the CA root file:
// one from --token-file, or --service-accounts minted with the dev issuer of
// --dev-state-dir, valid for tokenTTL.
func benchIdentities(f *benchCAFlags, td spiffeid.TrustDomain, tokenTTL time.Duration) ([]caload.Identity, string, error) {
	switch {
	case f.tokenFile != "" && f.devStateDir != "":
		return nil, "", errors.New("bench ca: --token-file and --dev-state-dir exclude each other")
	case f.tokenFile != "":
		if f.serviceAccounts != 1 {
			return nil, "", errors.New("bench ca: --service-accounts needs --dev-state-dir")
		}
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, "", fmt.Errorf("bench ca: token: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		id, err := identity.IDFromToken(tok, td)
		if err != nil {
			return nil, "", fmt.Errorf("bench ca: %s: %w", f.tokenFile, err)
		}
		if f.caRoot == "" {
			return nil, "", errors.New("bench ca: --ca-root is required with --token-file")
		}
		return []caload.Identity{{ID: id, Token: tok}}, f.caRoot, nil
	case f.devStateDir != "":
		if f.serviceAccounts < 1 {
			return nil, "", errors.New("bench ca: --service-accounts must be at least 1")
		}
		// LoadOrCreate would create a new issuer key that the running CA
		// does not trust: insist on the one meshid dev made.
		if _, err := os.Stat(filepath.Join(f.devStateDir, devissuer.KeyFile)); err != nil {
			return nil, "", fmt.Errorf("bench ca: %s is not the state directory of meshid dev (start `meshid dev --state-dir %s` first): %w", f.devStateDir, f.devStateDir, err)
		}
		iss, err := devissuer.LoadOrCreate(f.devStateDir, "")
		if err != nil {
			return nil, "", fmt.Errorf("bench ca: %w", err)
		}
		now := time.Now()
		ids := make([]caload.Identity, f.serviceAccounts)
		for i := range ids {
			sa := fmt.Sprintf("bench-%d", i)
			id, err := identity.ServiceAccount{Namespace: f.namespace, Name: sa}.ID(td)
			if err != nil {
				return nil, "", fmt.Errorf("bench ca: %w", err)
			}
			tok, err := iss.Mint(f.namespace, sa, []string{f.audience}, tokenTTL, now)
			if err != nil {
				return nil, "", fmt.Errorf("bench ca: %w", err)
			}
			ids[i] = caload.Identity{ID: id, Token: tok}
		}
		root := f.caRoot
		if root == "" {
			root = filepath.Join(f.devStateDir, "root-cert.pem")
		}
		return ids, root, nil
	}
	return nil, "", errors.New("bench ca: a token is needed: --token-file FILE or --dev-state-dir DIR")
}

// benchTLS verifies the CA with the roots in rootFile, for the name Istio's
// agent would check.
func benchTLS(rootFile, addr, serverName string) (*tls.Config, error) {
	pemData, err := os.ReadFile(rootFile)
	if err != nil {
		return nil, fmt.Errorf("bench ca: CA root: %w", err)
	}
	roots, err := certs.ParseCertificates(pemData)
	if err != nil {
		return nil, fmt.Errorf("bench ca: CA root %s: %w", rootFile, err)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	if serverName == "" {
		serverName = identity.CAServerName(addr)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}

func parseLevels(s string) ([]int, error) {
	var levels []int
	for p := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bench: --sweep %q: want positive integers separated by commas", s)
		}
		levels = append(levels, n)
	}
	return levels, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// startCPUProfile starts --cpuprofile, if set; stop ends and writes it.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench ca: --cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("bench ca: --cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return out.Close()
	}, nil
}
