package agentflood

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/bench/sdsload"
)

// Config is one attack. Zero counts skip their part.
type Config struct {
	// WorkloadSocket is the agent's Workload API socket; JWTCalls
	// FetchJWTSVID calls with distinct audiences are made on it,
	// JWTConcurrency at a time, each giving up after JWTDeadline.
	WorkloadSocket string
	JWTCalls       int
	JWTConcurrency int
	JWTDeadline    time.Duration
	// SDSSocket is the agent's SDS socket; HeaderStreams StreamSecrets
	// streams are opened with HeaderSize bytes of extra header each, then
	// Streams streams on one connection. They stay open until the end.
	SDSSocket     string
	HeaderStreams int
	HeaderSize    int
	Streams       int
	// Settle is how long to wait after the attack before the last sample.
	Settle time.Duration
	// What is measured (each optional): the agent's PID (RSS), a
	// goroutine profile URL (…/debug/pprof/goroutine?debug=1) and the CA's
	// /metrics URL (meshid_ca_jwtsvid_issued_total).
	AgentPID      int
	GoroutinesURL string
	CAMetricsURL  string
}

// Sample is one measurement; -1 where not measured.
type Sample struct {
	RSS        int64
	Goroutines int64
	CAMints    int64
}

// Report is what Run measured.
type Report struct {
	Before, After, Settled Sample
	// Codes counts the attack's calls and streams by gRPC code.
	JWTCodes, SDSCodes map[codes.Code]int
	// GoAways counts the server's GOAWAY codes on the SDS connections.
	GoAways map[string]int
	Took    time.Duration
}

// Run attacks and measures.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	r := &Report{JWTCodes: map[codes.Code]int{}, SDSCodes: map[codes.Code]int{}, GoAways: map[string]int{}}
	r.Before = sample(ctx, cfg)
	start := time.Now()
	if cfg.JWTCalls > 0 {
		if err := jwtFlood(ctx, cfg, r.JWTCodes); err != nil {
			return nil, err
		}
	}
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	if cfg.HeaderStreams > 0 || cfg.Streams > 0 {
		c, err := sdsFlood(cfg, r)
		closers = append(closers, c)
		if err != nil {
			return nil, err
		}
	}
	r.Took = time.Since(start)
	r.After = sample(ctx, cfg)
	select {
	case <-time.After(cfg.Settle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.Settled = sample(ctx, cfg)
	return r, nil
}

func jwtFlood(ctx context.Context, cfg Config, byCode map[codes.Code]int) error {
	conn, err := grpc.NewClient("unix://"+cfg.WorkloadSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := workloadpb.NewSpiffeWorkloadAPIClient(conn)
	ctx = metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true")
	var mu sync.Mutex
	sem := make(chan struct{}, max(cfg.JWTConcurrency, 1))
	var wg sync.WaitGroup
	for i := range cfg.JWTCalls {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			cctx, cancel := context.WithTimeout(ctx, cfg.JWTDeadline)
			defer cancel()
			_, err := c.FetchJWTSVID(cctx, &workloadpb.JWTSVIDRequest{Audience: []string{"flood-" + strconv.Itoa(i)}})
			mu.Lock()
			byCode[status.Code(err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// sdsFlood opens the SDS streams with a raw HTTP/2 client, and returns
// what closes them. HeaderStreams: one connection each (the server may
// close a connection that sends too much); Streams: all on one connection.
// A stream counts as OK when the server kept it open.
func sdsFlood(cfg Config, r *Report) (func(), error) {
	byCode := r.SDSCodes
	var conns []*H2
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for range cfg.HeaderStreams {
		c, err := DialH2(cfg.SDSSocket, time.Minute)
		if err != nil {
			return closeAll, err
		}
		conns = append(conns, c)
		_ = c.Open(1, StreamSecretsPath, cfg.HeaderSize)
		ended, closed, goAway := c.Outcomes()
		byCode[outcomeCode(ended[1], closed)]++
		if goAway != "" {
			r.GoAways[goAway]++
		}
	}
	if cfg.Streams > 0 {
		c, err := DialH2(cfg.SDSSocket, 5*time.Minute)
		if err != nil {
			return closeAll, err
		}
		conns = append(conns, c)
		ended, closed, goAway := c.OpenMany(1, cfg.Streams, StreamSecretsPath)
		if goAway != "" {
			r.GoAways[goAway]++
		}
		for i := range cfg.Streams {
			byCode[outcomeCode(ended[uint32(2*i+1)], closed)]++
		}
	}
	return closeAll, nil
}

// outcomeCode is a stream's outcome as a gRPC code: OK while open,
// ResourceExhausted when refused (REFUSED_STREAM, or grpc-status 8),
// Unavailable when the connection was closed, Unknown otherwise.
func outcomeCode(ended string, closed bool) codes.Code {
	switch {
	case ended == "" && !closed:
		return codes.OK
	case ended == "" && closed:
		return codes.Unavailable
	case ended == "rst "+http2.ErrCodeRefusedStream.String(), ended == "grpc-status 8":
		return codes.ResourceExhausted
	}
	return codes.Unknown
}

func sample(ctx context.Context, cfg Config) Sample {
	s := Sample{RSS: -1, Goroutines: -1, CAMints: -1}
	if cfg.AgentPID > 0 {
		if rss, err := sdsload.RSS(cfg.AgentPID); err == nil {
			s.RSS = int64(rss)
		}
	}
	if cfg.GoroutinesURL != "" {
		if body, err := get(ctx, cfg.GoroutinesURL); err == nil {
			if m := totalRE.FindStringSubmatch(body); m != nil {
				s.Goroutines, _ = strconv.ParseInt(m[1], 10, 64)
			}
		}
	}
	if cfg.CAMetricsURL != "" {
		if body, err := get(ctx, cfg.CAMetricsURL); err == nil {
			s.CAMints = counter(body, "meshid_ca_jwtsvid_issued_total")
		}
	}
	return s
}

var totalRE = regexp.MustCompile(`goroutine profile: total (\d+)`)

func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	return string(b), err
}

// counter is the value of the counter name in a Prometheus text page, or -1.
func counter(page, name string) int64 {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		return -1
	}
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		return -1
	}
	return int64(f.GetMetric()[0].GetCounter().GetValue())
}

// Format writes r as a table.
func (r *Report) Format(w io.Writer) {
	fmt.Fprintf(w, "attack took %s\n", r.Took.Round(time.Millisecond))
	if len(r.JWTCodes) > 0 {
		fmt.Fprintf(w, "FetchJWTSVID calls by code: %v\n", r.JWTCodes)
	}
	if len(r.SDSCodes) > 0 {
		fmt.Fprintf(w, "SDS streams by code (OK: held open; Unavailable: connection closed): %v\n", r.SDSCodes)
	}
	if len(r.GoAways) > 0 {
		fmt.Fprintf(w, "GOAWAY from the server: %v\n", r.GoAways)
	}
	fmt.Fprintf(w, "%-10s %12s %12s %12s\n", "", "RSS MiB", "goroutines", "CA mints")
	for _, row := range []struct {
		name string
		s    Sample
	}{{"before", r.Before}, {"after", r.After}, {"settled", r.Settled}} {
		fmt.Fprintf(w, "%-10s %12s %12s %12s\n", row.name, mib(row.s.RSS), num(row.s.Goroutines), num(row.s.CAMints))
	}
}

func mib(b int64) string {
	if b < 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64)
}

func num(n int64) string {
	if n < 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}
