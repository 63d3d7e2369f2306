package caload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults.
const (
	DefaultConcurrency      = 8
	DefaultDuration         = 10 * time.Second
	DefaultTimeout          = 30 * time.Second
	DefaultProgressInterval = time.Second
)

// CodeBadResponse counts answers that were not errors but carried no usable
// chain (fewer than two cert_chain elements, which Istio's client rejects).
const CodeBadResponse = "BadResponse"

// Client is the part of the generated IstioCertificateService client that the
// load uses.
type Client interface {
	CreateCertificate(ctx context.Context, in *securityapi.IstioCertificateRequest, opts ...grpc.CallOption) (*securityapi.IstioCertificateResponse, error)
}

// Identity is one caller of the load: the SPIFFE ID put in its CSRs and the
// bearer token that proves it.
type Identity struct {
	ID    spiffeid.ID
	Token string // sent as "authorization: Bearer <token>"; empty sends none
}

// Config configures a Loader.
type Config struct {
	// Clients send the requests; worker i uses Clients[i%len(Clients)], so
	// several clients spread the load over several connections. Required.
	Clients []Client
	// Identities are used in turn, request by request. Required.
	Identities []Identity
	// KeyType is the leaf key algorithm; empty means ec-p256.
	KeyType certs.KeyType
	// Pregen makes one key and CSR per identity before the run starts and
	// reuses them, so that key generation is not measured.
	Pregen bool
	// Concurrency is the number of requests in flight; 0 means 8.
	Concurrency int
	// Requests, when positive, is the number of requests of a run.
	// Otherwise a run lasts Duration (0 means 10s) and the requests in
	// flight when it ends are completed and counted.
	Requests int
	Duration time.Duration
	// TTL is the requested validity; 0 asks for the CA's default.
	TTL time.Duration
	// ClusterID, when set, is sent in the request metadata as Istio does.
	ClusterID string
	// Timeout bounds each request; 0 means 30s.
	Timeout time.Duration
	// Progress, when set, is called about every ProgressInterval (0 means
	// 1s) during a run, from a goroutine of its own.
	Progress         func(Progress)
	ProgressInterval time.Duration
	// ServerCPU and ClientCPU, when set, read the CPU time the CA process
	// and the load's own process have used so far (cputime.Of, cputime.Self);
	// each run reads them before and after, and reports CPU per
	// certificate, which other load on the machine does not distort.
	ServerCPU func() (time.Duration, error)
	ClientCPU func() (time.Duration, error)

	Clock  clock.Clock
	Logger *slog.Logger // nil discards logs
}

// Progress is a snapshot of a running load.
type Progress struct {
	Concurrency int
	Elapsed     time.Duration
	Done        int64   // requests completed
	OK          int64   // of which succeeded
	Rate        float64 // completions per second since the previous snapshot
}

// Loader runs loads against a CA.
type Loader struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger
	meta  *structpb.Struct

	mu   sync.Mutex
	csrs []string // one PEM CSR per identity when Pregen, made by the first run
}

// New validates cfg and returns a Loader. It generates nothing yet.
func New(cfg Config) (*Loader, error) {
	if len(cfg.Clients) == 0 {
		return nil, errors.New("caload: no client")
	}
	for i, c := range cfg.Clients {
		if c == nil {
			return nil, fmt.Errorf("caload: client %d is nil", i)
		}
	}
	if len(cfg.Identities) == 0 {
		return nil, errors.New("caload: no identity")
	}
	for i, id := range cfg.Identities {
		if id.ID.IsZero() {
			return nil, fmt.Errorf("caload: identity %d has no SPIFFE ID", i)
		}
	}
	cfg.KeyType = cmp.Or(cfg.KeyType, certs.ECP256)
	if _, err := certs.ParseKeyType(string(cfg.KeyType)); err != nil {
		return nil, fmt.Errorf("caload: %w", err)
	}
	switch {
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("caload: concurrency %d is negative", cfg.Concurrency)
	case cfg.Concurrency == 0:
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Requests < 0 || cfg.Duration < 0 || cfg.TTL < 0 || cfg.Timeout < 0 || cfg.ProgressInterval < 0 {
		return nil, errors.New("caload: requests, duration, ttl, timeout and progress interval must not be negative")
	}
	cfg.Duration = cmp.Or(cfg.Duration, DefaultDuration)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, DefaultProgressInterval)
	l := &Loader{cfg: cfg, clock: clock.OrReal(cfg.Clock), log: cfg.Logger}
	l.log = logs.OrDiscard(l.log)
	if cfg.ClusterID != "" {
		l.meta = &structpb.Struct{Fields: map[string]*structpb.Value{"ClusterID": structpb.NewStringValue(cfg.ClusterID)}}
	}
	return l, nil
}

// Run runs the configured load at the configured concurrency.
func (l *Loader) Run(ctx context.Context) (*Report, error) {
	return l.RunAt(ctx, l.cfg.Concurrency)
}

// Sweep runs the load once per concurrency level, in order, and returns one
// report per level. It stops at the first level that fails or when ctx ends.
func (l *Loader) Sweep(ctx context.Context, levels []int) ([]*Report, error) {
	reports := make([]*Report, 0, len(levels))
	for _, c := range levels {
		r, err := l.RunAt(ctx, c)
		if err != nil {
			return reports, err
		}
		reports = append(reports, r)
		if ctx.Err() != nil {
			return reports, ctx.Err()
		}
	}
	return reports, nil
}

// Prepare makes the keys and CSRs of Pregen now (RunAt does it on first use).
// It is a no-op without Pregen or when already done.
func (l *Loader) Prepare(ctx context.Context) error {
	_, err := l.pregen(ctx)
	return err
}

func (l *Loader) pregen(ctx context.Context) ([]string, error) {
	if !l.cfg.Pregen {
		return nil, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.csrs != nil {
		return l.csrs, nil
	}
	csrs := make([]string, len(l.cfg.Identities))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, id := range l.cfg.Identities {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			pem, err := newCSR(l.cfg.KeyType, id.ID)
			csrs[i] = pem
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	l.log.Debug("pregenerated CSRs", logs.KeyCount, len(csrs), logs.KeyKeyType, l.cfg.KeyType)
	l.csrs = csrs
	return csrs, nil
}

// newCSR makes a key of type kt and a PEM CSR for id signed by it.
func newCSR(kt certs.KeyType, id spiffeid.ID) (string, error) {
	key, err := certs.GenerateKey(kt)
	if err != nil {
		return "", fmt.Errorf("caload: %w", err)
	}
	der, err := certs.NewCSR(key, id)
	if err != nil {
		return "", fmt.Errorf("caload: %w", err)
	}
	return string(certs.EncodeCSR(der)), nil
}

// message is what an operator needs of a failed request: the status
// message (the CA's reason), or the error; "no usable certificate chain"
// for a bad response.
func message(err error) string {
	if err == nil {
		return "the answer holds no usable certificate chain"
	}
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// outcome classifies a finished request: "" for success, else a gRPC code
// name (Unknown for an error that carries no status) or CodeBadResponse.
func outcome(resp *securityapi.IstioCertificateResponse, err error) string {
	if err != nil {
		return status.Code(err).String()
	}
	if len(resp.GetCertChain()) < 2 {
		return CodeBadResponse
	}
	return ""
}
