package caload_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/bench/caload"
	"github.com/meshid/meshid/bench/latency"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// fakeCA answers like a CA: it parses the CSR and checks that its SPIFFE ID
// is the one the bearer token names (tokens are "tok-<sa>" here), and lets a
// test pick failures and a simulated latency per call.
type fakeCA struct {
	mu      sync.Mutex
	calls   int
	perSA   map[string]int
	csrs    map[string]bool
	metaCID []string
	answer  func(call int) (chainLen int, err error) // nil: always a 3-element chain
	advance func(call int)                           // simulate latency (called inside the call)
}

func (f *fakeCA) CreateCertificate(ctx context.Context, in *securityapi.IstioCertificateRequest, _ ...grpc.CallOption) (*securityapi.IstioCertificateResponse, error) {
	block, _ := pem.Decode([]byte(in.GetCsr()))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, status.Error(codes.InvalidArgument, "bad PEM")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || csr.CheckSignature() != nil {
		return nil, status.Error(codes.InvalidArgument, "bad CSR")
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) != 1 || !strings.HasPrefix(auth[0], "Bearer tok-") {
		return nil, status.Error(codes.Unauthenticated, "no token")
	}
	sa := strings.TrimPrefix(auth[0], "Bearer tok-")
	if len(csr.URIs) != 1 || !strings.HasSuffix(csr.URIs[0].String(), "/sa/"+sa) {
		return nil, status.Error(codes.PermissionDenied, "identity mismatch")
	}
	f.mu.Lock()
	call := f.calls
	f.calls++
	if f.perSA == nil {
		f.perSA, f.csrs = map[string]int{}, map[string]bool{}
	}
	f.perSA[sa]++
	f.csrs[in.GetCsr()] = true
	if cid := in.GetMetadata().GetFields()["ClusterID"]; cid != nil {
		f.metaCID = append(f.metaCID, cid.GetStringValue())
	}
	f.mu.Unlock()
	if f.advance != nil {
		f.advance(call)
	}
	chainLen, aerr := 3, error(nil)
	if f.answer != nil {
		chainLen, aerr = f.answer(call)
	}
	if aerr != nil {
		return nil, aerr
	}
	return &securityapi.IstioCertificateResponse{CertChain: make([]string, chainLen)}, nil
}

func identities(t *testing.T, n int) []caload.Identity {
	t.Helper()
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	ids := make([]caload.Identity, n)
	for i := range ids {
		sa := fmt.Sprintf("bench-%d", i)
		id, err := spiffeid.FromSegments(td, "ns", "bench", "sa", sa)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = caload.Identity{ID: id, Token: "tok-" + sa}
	}
	return ids
}

func TestRunRequestsCountsAndIdentities(t *testing.T) {
	tests := []struct {
		name       string
		pregen     bool
		keyType    certs.KeyType
		ids        int
		requests   int
		conc       int
		wantCSRs   int // distinct CSRs the CA saw
		clusterID  string
		answer     func(int) (int, error)
		wantOK     int
		wantErrors map[string]int
	}{
		{name: "pregen reuses one CSR per identity", pregen: true, ids: 3, requests: 30, conc: 4, wantCSRs: 3, wantOK: 30},
		{name: "fresh key per request", ids: 2, requests: 6, conc: 2, wantCSRs: 6, wantOK: 6, clusterID: "c1"},
		{name: "rsa pregen", pregen: true, keyType: certs.RSA2048, ids: 1, requests: 5, conc: 3, wantCSRs: 1, wantOK: 5},
		{
			name: "errors by code", pregen: true, ids: 2, requests: 12, conc: 3, wantCSRs: 2,
			answer: func(call int) (int, error) {
				switch call % 4 {
				case 1:
					return 0, status.Error(codes.ResourceExhausted, "slow down")
				case 2:
					return 1, nil // a chain without a root
				}
				return 2, nil
			},
			wantOK: 6, wantErrors: map[string]int{"ResourceExhausted": 3, caload.CodeBadResponse: 3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCA{answer: tt.answer}
			l, err := caload.New(caload.Config{
				Clients: []caload.Client{f, f}, Identities: identities(t, tt.ids), KeyType: tt.keyType,
				Pregen: tt.pregen, Concurrency: tt.conc, Requests: tt.requests, ClusterID: tt.clusterID,
			})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := l.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != tt.requests || rep.OK != tt.wantOK || f.calls != tt.requests {
				t.Errorf("requests=%d ok=%d calls=%d, want %d %d %d", rep.Requests, rep.OK, f.calls, tt.requests, tt.wantOK, tt.requests)
			}
			wantErrs := tt.wantErrors
			if wantErrs == nil {
				wantErrs = map[string]int{}
			}
			if fmt.Sprint(rep.Errors) != fmt.Sprint(wantErrs) {
				t.Errorf("errors = %v, want %v", rep.Errors, wantErrs)
			}
			if tt.wantErrors != nil {
				want := map[string]string{"ResourceExhausted": "slow down", caload.CodeBadResponse: "the answer holds no usable certificate chain"}
				if fmt.Sprint(rep.FirstErrors) != fmt.Sprint(want) {
					t.Errorf("first errors = %v, want %v", rep.FirstErrors, want)
				}
				var sb strings.Builder
				if err := caload.WriteTable(&sb, []*caload.Report{rep}); err != nil {
					t.Fatal(err)
				}
				if !strings.HasSuffix(sb.String(), "\nfirst error of each code:\n  BadResponse: the answer holds no usable certificate chain\n  ResourceExhausted: slow down\n") {
					t.Errorf("table does not end with the first error of each code:\n%s", sb.String())
				}
			}
			if len(f.csrs) != tt.wantCSRs {
				t.Errorf("CA saw %d distinct CSRs, want %d", len(f.csrs), tt.wantCSRs)
			}
			if len(f.perSA) != tt.ids {
				t.Errorf("CA saw %d service accounts, want %d", len(f.perSA), tt.ids)
			}
			for sa, n := range f.perSA {
				if n != tt.requests/tt.ids {
					t.Errorf("%s made %d requests, want %d (round robin)", sa, n, tt.requests/tt.ids)
				}
			}
			if tt.clusterID != "" && (len(f.metaCID) != tt.requests || f.metaCID[0] != tt.clusterID) {
				t.Errorf("ClusterID metadata = %v", f.metaCID)
			}
			if rep.Latency.Count != tt.wantOK || rep.Concurrency != tt.conc || rep.Identities != tt.ids || rep.Pregen != tt.pregen {
				t.Errorf("report = %+v", rep)
			}
		})
	}
}

func TestRunMeasuresWithTheClock(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	f := &fakeCA{advance: func(call int) { clk.Add(time.Duration(call+1) * time.Millisecond) }}
	l, err := caload.New(caload.Config{
		Clients: []caload.Client{f}, Identities: identities(t, 1), Pregen: true,
		Concurrency: 1, Requests: 4, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	want := latency.Summary{Count: 4, Min: ms, Mean: 2500 * time.Microsecond, P50: 2 * ms, P90: 4 * ms, P99: 4 * ms, Max: 4 * ms}
	if rep.Latency != want {
		t.Errorf("latency = %+v, want %+v", rep.Latency, want)
	}
	if rep.Elapsed != 10*ms || rep.Throughput != 400 {
		t.Errorf("elapsed=%v throughput=%v, want 10ms 400/s", rep.Elapsed, rep.Throughput)
	}
}

func TestRunForDurationWithProgress(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	progress := make(chan caload.Progress, 10)
	l, err := caload.New(caload.Config{
		Clients: []caload.Client{&fakeCA{}}, Identities: identities(t, 2), Pregen: true,
		Concurrency: 2, Duration: 3 * time.Second, Clock: clk,
		Progress: func(p caload.Progress) { progress <- p },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := testkit.Go(func() (*caload.Report, error) { return l.Run(context.Background()) })
	stop := make(chan struct{})
	defer close(stop)
	for i := 1; i <= 2; i++ {
		clk.WaitForWaiters(2, stop) // the duration timer and the progress timer
		clk.Add(time.Second)
		p := <-progress
		if p.Elapsed != time.Duration(i)*time.Second || p.Concurrency != 2 || p.Done < p.OK {
			t.Errorf("progress %d = %+v", i, p)
		}
	}
	clk.WaitForWaiters(2, stop)
	clk.Add(time.Second) // the duration ends
	res := <-done
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.Value.Requests == 0 || res.Value.OK != res.Value.Requests || len(res.Value.Errors) != 0 {
		t.Errorf("report = %+v", res.Value)
	}
	if res.Value.Elapsed < 3*time.Second {
		t.Errorf("elapsed = %v, want >= 3s", res.Value.Elapsed)
	}
}

func TestSweep(t *testing.T) {
	f := &fakeCA{}
	l, err := caload.New(caload.Config{Clients: []caload.Client{f}, Identities: identities(t, 1), Pregen: true, Requests: 5})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := l.Sweep(context.Background(), []int{1, 2, 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 3 || f.calls != 15 || len(f.csrs) != 1 {
		t.Fatalf("%d reports, %d calls, %d CSRs; want 3, 15, 1 (keys made once)", len(reps), f.calls, len(f.csrs))
	}
	for i, c := range []int{1, 2, 4} {
		if reps[i].Concurrency != c || reps[i].OK != 5 {
			t.Errorf("report %d = %+v", i, reps[i])
		}
	}
}

func TestNewRejects(t *testing.T) {
	ids := identities(t, 1)
	c := []caload.Client{&fakeCA{}}
	tests := []struct {
		name string
		cfg  caload.Config
		want string
	}{
		{"no client", caload.Config{Identities: ids}, "no client"},
		{"no identity", caload.Config{Clients: c}, "no identity"},
		{"zero id", caload.Config{Clients: c, Identities: []caload.Identity{{Token: "x"}}}, "no SPIFFE ID"},
		{"key type", caload.Config{Clients: c, Identities: ids, KeyType: "dsa"}, "unknown key type"},
		{"negative concurrency", caload.Config{Clients: c, Identities: ids, Concurrency: -1}, "negative"},
		{"negative requests", caload.Config{Clients: c, Identities: ids, Requests: -1}, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := caload.New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "caload: ") {
				t.Errorf("New error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestReportJSONAndTable(t *testing.T) {
	r := &caload.Report{
		Concurrency: 8, KeyType: "ec-p256", Pregen: true, Identities: 100,
		Elapsed: 2 * time.Second, Requests: 1005, OK: 1000,
		Errors:     map[string]int{"Unavailable": 1, "ResourceExhausted": 4},
		Throughput: 500,
		Latency:    latency.Summary{Count: 1000, P50: 1500 * time.Microsecond, P90: 2 * time.Millisecond, P99: 12 * time.Millisecond, Max: 40 * time.Millisecond},
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back caload.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%+v", back) != fmt.Sprintf("%+v", *r) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, *r)
	}
	for _, field := range []string{`"certs_per_second":500`, `"elapsed_s":2`, `"ResourceExhausted":4`, `"p99_ms":12`} {
		if !strings.Contains(string(b), field) {
			t.Errorf("JSON %s lacks %s", b, field)
		}
	}
	var sb strings.Builder
	if err := caload.WriteTable(&sb, []*caload.Report{r, {Concurrency: 1, Requests: 3, OK: 3, Throughput: 12.34}}); err != nil {
		t.Fatal(err)
	}
	const want = `CONCURRENCY  REQUESTS  OK    CERTS/S  P50     P90     P99     MAX     ERRORS
8            1005      1000  500.0    1.50ms  2.00ms  12.0ms  40.0ms  ResourceExhausted=4 Unavailable=1
1            3         3     12.3     0       0       0       0       -
`
	if sb.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", sb.String(), want)
	}
}

func TestRunMeasuresCPU(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	var server, client time.Duration
	f := &fakeCA{advance: func(int) { server += 300 * time.Microsecond; client += 100 * time.Microsecond }}
	l, err := caload.New(caload.Config{
		Clients: []caload.Client{f}, Identities: identities(t, 2), Pregen: true,
		Concurrency: 1, Requests: 10, Clock: clk,
		ServerCPU: func() (time.Duration, error) { return server, nil },
		ClientCPU: func() (time.Duration, error) { return client, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	server, client = time.Hour, time.Minute // CPU used before the run is not counted
	rep, err := l.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.ServerCPU != 3*time.Millisecond || rep.ClientCPU != time.Millisecond ||
		rep.CPUPerCert(rep.ServerCPU) != 300*time.Microsecond || rep.CPUPerCert(rep.ClientCPU) != 100*time.Microsecond {
		t.Errorf("server %v client %v, want 3ms and 1ms", rep.ServerCPU, rep.ClientCPU)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"ca_cpu_s":0.003`, `"client_cpu_s":0.001`, `"ca_cpu_us_per_cert":300`, `"client_cpu_us_per_cert":100`} {
		if !strings.Contains(string(b), field) {
			t.Errorf("JSON %s lacks %s", b, field)
		}
	}
	var sb strings.Builder
	if err := caload.WriteTable(&sb, []*caload.Report{rep}); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(sb.String(), "\n"); !strings.HasSuffix(lines[0], "CA CPU/CERT  LOAD CPU/CERT") || !strings.HasSuffix(lines[1], "300µs        100µs") {
		t.Errorf("table:\n%s", sb.String())
	}

	failing := errors.New("no /proc")
	l, err = caload.New(caload.Config{
		Clients: []caload.Client{f}, Identities: identities(t, 1), Requests: 1, Clock: clk,
		ServerCPU: func() (time.Duration, error) { return 0, failing },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Run(context.Background()); !errors.Is(err, failing) {
		t.Errorf("CPU read failure: err = %v", err)
	}
}
