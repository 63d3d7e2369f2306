package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/bench/caload"
	"github.com/meshid/meshid/internal/bench/chart"
	"github.com/meshid/meshid/internal/bench/sdsload"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/secretcache"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load a CA or an agent and report throughput, latency and memory",
		Long: `meshid bench measures a running meshid (or any Istio-compatible) CA or agent.

  bench ca    CreateCertificate load: certificates/s, latency p50/p90/p99/max,
              errors by gRPC code; --sweep runs several concurrency levels and
              --chart draws throughput against concurrency.
  bench sds   N SDS streams against an agent's socket: time until each stream
              holds default and ROOTCA, the agent's RSS, and with --rotate the
              time for a forced rotation to reach every stream.

Progress goes to standard error once a second; the report (a table, or JSON
with -o json) goes to standard output.`,
	}
	cmd.AddCommand(newBenchCACmd(), newBenchSDSCmd())
	return cmd
}

type benchCAFlags struct {
	addr, caRoot, serverName     string
	tokenFile, devStateDir       string
	namespace, trustDomain       string
	audience, keyType, clusterID string
	output, sweep, chart         string
	serviceAccounts, concurrency int
	requests, connections        int
	duration, timeout, ttl       time.Duration
	pregen, quiet                bool
}

func newBenchCACmd() *cobra.Command {
	f := &benchCAFlags{}
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Load a CA with CreateCertificate calls",
		Long: `meshid bench ca sends CreateCertificate requests (istio.v1.auth.IstioCertificateService)
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
		Example: `  meshid bench ca --dev-state-dir .meshid-dev --pregen-keys --duration 10s
  meshid bench ca --dev-state-dir .meshid-dev --service-accounts 100 --pregen-keys --requests 5000 -o json
  meshid bench ca --dev-state-dir .meshid-dev --pregen-keys --duration 5s --sweep 1,8,64 --chart docs/ca-throughput.svg
  meshid bench ca --addr istiod.istio-system.svc:15012 --ca-root root-cert.pem --token-file ./var/run/secrets/tokens/istio-token`,
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
	fl.StringVar(&f.keyType, "key-type", string(certs.ECP256), "leaf key type: "+keyTypeList())
	fl.BoolVar(&f.pregen, "pregen-keys", false, "generate one key and CSR per service account before measuring")
	fl.StringVar(&f.sweep, "sweep", "", "comma-separated concurrency `levels` (e.g. 1,2,4,8,16,32,64): one run and one row per level")
	fl.StringVar(&f.chart, "chart", "", "write a throughput-vs-concurrency chart to this .svg or .png `file`")
	fl.IntVar(&f.connections, "connections", 1, "gRPC connections to spread the requests over")
	fl.DurationVar(&f.ttl, "ttl", 0, "requested certificate validity (0: the CA's default)")
	fl.StringVar(&f.clusterID, "cluster-id", "", "ClusterID sent in the request metadata, as Istio's agent does")
	fl.DurationVar(&f.timeout, "timeout", caload.DefaultTimeout, "timeout of each request")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress lines on standard error")
	return cmd
}

func keyTypeList() string {
	s := make([]string, len(certs.KeyTypes))
	for i, k := range certs.KeyTypes {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// benchCAResult is the JSON document of `bench ca -o json`.
type benchCAResult struct {
	Addr string           `json:"addr"`
	Runs []*caload.Report `json:"runs"`
}

func runBenchCA(cmd *cobra.Command, f *benchCAFlags) error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("bench ca: -o %q: want table or json", f.output)
	}
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
	ids, caRoot, err := benchIdentities(f, td, time.Hour+2*runFor)
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
	reports, runErr := l.Sweep(ctx, levels)
	if len(reports) == 0 && runErr != nil {
		return fmt.Errorf("bench ca: %w", runErr)
	}
	out := cmd.OutOrStdout()
	if f.output == "json" {
		err = writeJSON(out, benchCAResult{Addr: f.addr, Runs: reports})
	} else {
		err = caload.WriteTable(out, reports)
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
		id, err := secretcache.IdentityFromToken(tok, td)
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
			id, err := spiffeid.FromSegments(td, "ns", f.namespace, "sa", sa)
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
		serverName = caServerName(addr)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}

// caServerName is the name Istio's agent verifies the CA under: the host of
// addr, with a host containing "localhost" replaced by istiod.istio-system.svc.
func caServerName(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.Contains(host, "localhost") {
		return "istiod.istio-system.svc"
	}
	return host
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

type benchSDSFlags struct {
	socket, agentAdmin, output string
	resources                  []string
	streams, perConn, open     int
	agentPID                   int
	rotate, quiet              bool
	timeout                    time.Duration
}

func newBenchSDSCmd() *cobra.Command {
	f := &benchSDSFlags{}
	cmd := &cobra.Command{
		Use:   "sds",
		Short: "Open many SDS streams against an agent and time default, ROOTCA and a rotation",
		Long: `meshid bench sds opens --streams SDS streams (StreamSecrets, as Envoy does) on the
agent's socket, --streams-per-conn per gRPC connection, each subscribing to
default and ROOTCA and acknowledging every response.

It reports the time until each stream holds both (p50/p90/p99/max), the agent's
RSS before and after the streams opened when --agent-pid is given, and with
--rotate the time from a forced rotation (POST http://<agent-admin>/debug/rotate)
until every stream holds a new default certificate.`,
		Example: `  meshid bench sds --sds-socket .meshid-dev/sds.sock --streams 1000
  meshid bench sds --sds-socket ./var/run/secrets/workload-spiffe-uds/socket --streams 10000 \
      --agent-pid $(pgrep -f 'meshid agent') --rotate --agent-admin 127.0.0.1:15020
  meshid bench sds --sds-socket .meshid-dev/sds.sock --streams 2000 --open-concurrency 1   # one new stream at a time, warm cache`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchSDS(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.socket, "sds-socket", "./var/run/secrets/workload-spiffe-uds/socket", "the agent's SDS Unix `socket`")
	fl.IntVar(&f.streams, "streams", 1000, "number of SDS streams")
	fl.IntVar(&f.perConn, "streams-per-conn", sdsload.DefaultStreamsPerConn, "streams per gRPC connection")
	fl.IntVar(&f.open, "open-concurrency", 0, "streams opening at once (0: all together; 1: one at a time)")
	fl.StringSliceVar(&f.resources, "resource", nil, "resource `name` each stream subscribes to (repeatable; default: default,ROOTCA)")
	fl.IntVar(&f.agentPID, "agent-pid", 0, "the agent's `pid`, to report its RSS (0: not measured)")
	fl.BoolVar(&f.rotate, "rotate", false, "force a rotation once every stream is ready and time its fan-out")
	fl.StringVar(&f.agentAdmin, "agent-admin", "127.0.0.1:15020", "the agent's monitoring `address`, serving POST "+sdsload.RotatePath)
	fl.DurationVar(&f.timeout, "timeout", sdsload.DefaultTimeout, "bound on the wait for the streams, and again for the rotation")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress lines on standard error")
	return cmd
}

func runBenchSDS(cmd *cobra.Command, f *benchSDSFlags) error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("bench sds: -o %q: want table or json", f.output)
	}
	if f.agentPID == os.Getpid() {
		f.agentPID = 0 // the agent is in this process: its RSS includes the load
	}
	stderr := cmd.ErrOrStderr()
	cfg := sdsload.Config{
		Socket: f.socket, Streams: f.streams, StreamsPerConn: f.perConn, OpenConcurrency: f.open,
		Resources: f.resources, PID: f.agentPID, Timeout: f.timeout,
	}
	if f.rotate {
		cfg.Rotate = sdsload.HTTPRotate(nil, f.agentAdmin)
	}
	if !f.quiet {
		cfg.Progress = func(p sdsload.Progress) {
			if p.Phase == sdsload.PhaseRotate {
				fmt.Fprintf(stderr, "bench sds: rotation  %5.1fs  %d/%d streams rotated  %d failed\n", p.Elapsed.Seconds(), p.Rotated, p.Streams, p.Failed)
				return
			}
			fmt.Fprintf(stderr, "bench sds: opening  %5.1fs  %d/%d streams ready  %d failed\n", p.Elapsed.Seconds(), p.Ready, p.Streams, p.Failed)
		}
	}
	l, err := sdsload.New(cfg)
	if err != nil {
		return fmt.Errorf("bench sds: %w", err)
	}
	rep, runErr := l.Run(cmd.Context())
	if rep == nil {
		return fmt.Errorf("bench sds: %w", runErr)
	}
	out := cmd.OutOrStdout()
	if f.output == "json" {
		err = writeJSON(out, rep)
	} else {
		err = rep.WriteTable(out)
	}
	if err != nil {
		return err
	}
	if runErr != nil {
		return fmt.Errorf("bench sds: %w", runErr)
	}
	if rep.Failed > 0 {
		return fmt.Errorf("bench sds: %d of %d streams failed", rep.Failed, rep.Streams)
	}
	return nil
}
