package sdsload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/procfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshid/meshid/bench/latency"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults.
const (
	DefaultStreamsPerConn   = 100
	DefaultCertResource     = "default"
	DefaultRootResource     = "ROOTCA"
	DefaultNodeID           = "sidecar~127.0.0.1~meshid-bench.bench~bench.svc.cluster.local"
	DefaultTimeout          = time.Minute
	DefaultProgressInterval = time.Second
	// Flow-control windows of the client connections: large enough that a
	// rotation pushed to every stream of a connection at once is not held
	// back by the client.
	DefaultStreamWindow = 1 << 20
	DefaultConnWindow   = 16 << 20
	// DefaultHoldGCLimit is the soft memory limit of this process while
	// HoldGC keeps its garbage collector off: 10,000 streams took about
	// 300 MiB of client heap.
	DefaultHoldGCLimit = 1 << 30
)

// Config configures a Loader.
type Config struct {
	// Socket is the agent's SDS Unix socket. Required.
	Socket string
	// Streams is the number of SDS streams to open. Required.
	Streams int
	// StreamsPerConn is the number of streams per gRPC connection; 0
	// means 100.
	StreamsPerConn int
	// OpenConcurrency, when positive, is the number of streams opening
	// at once: a stream opens only when fewer than that many are still
	// waiting for their resources. 0 opens every stream at once, like a
	// node full of proxies starting together; 1 measures one new stream
	// at a time against a warm cache.
	OpenConcurrency int
	// Resources are subscribed by every stream; nil means "default" and
	// "ROOTCA".
	Resources []string
	// CertResource is the resource whose new content marks a rotation;
	// empty means "default". It must be one of Resources.
	CertResource string
	// NodeID is the node id of the first request (suffixed with the
	// stream's number); empty means an Istio-like sidecar id.
	NodeID string
	// Rotate, when set, forces a rotation once every stream is ready, and
	// the load measures until every stream holds a new CertResource.
	Rotate func(ctx context.Context) error
	// PID is the agent's process, whose resident memory is reported; 0
	// skips it (for an agent in this process).
	PID int
	// Timeout bounds the wait for every stream to be ready, and again for
	// the rotation to reach every stream; 0 means one minute.
	Timeout time.Duration
	// Progress, when set, is called about every ProgressInterval (0
	// means 1s), from a goroutine of its own.
	Progress         func(Progress)
	ProgressInterval time.Duration
	// Slowest is the number of slowest streams whose phases the report
	// lists (Report.Slowest); 0 lists none.
	Slowest int
	// HoldGC turns this process's garbage collector off while Run
	// measures (after one collection), with a soft memory limit of
	// HoldGCLimit bytes (0 means DefaultHoldGCLimit; a lower GOMEMLIMIT
	// stays). The load's own mark phases otherwise delay its receiving
	// of responses and are measured as the agent's latency (see holdGC).
	// It changes process-wide settings: leave it off when the agent runs
	// in the same process and its collections are part of what is
	// measured.
	HoldGC      bool
	HoldGCLimit int64
	// DialOptions are added to the defaults (insecure Unix-socket
	// transport, large flow-control windows).
	DialOptions []grpc.DialOption

	Clock  clock.Clock
	Logger *slog.Logger // nil discards logs
}

// Phase names what a run is doing.
type Phase string

// Phases of a run.
const (
	PhaseOpen   Phase = "open"
	PhaseRotate Phase = "rotate"
)

// Progress is a snapshot of a running load.
type Progress struct {
	Phase   Phase
	Elapsed time.Duration // since the phase began
	Streams int
	Ready   int // streams holding every resource
	Failed  int // streams that ended with an error
	Rotated int // streams holding a new certificate (rotate phase)
}

// Loader runs SDS loads.
type Loader struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger
	names []string
	cert  int // index of CertResource in names
	addr  string
}

// New validates cfg and returns a Loader. It connects to nothing yet.
func New(cfg Config) (*Loader, error) {
	if cfg.Socket == "" {
		return nil, errors.New("sdsload: no socket")
	}
	if cfg.Streams <= 0 {
		return nil, fmt.Errorf("sdsload: streams %d must be positive", cfg.Streams)
	}
	if cfg.StreamsPerConn < 0 || cfg.OpenConcurrency < 0 || cfg.Timeout < 0 || cfg.ProgressInterval < 0 || cfg.PID < 0 || cfg.HoldGCLimit < 0 || cfg.Slowest < 0 {
		return nil, errors.New("sdsload: streams per connection, open concurrency, timeout, progress interval, pid, GC hold limit and slowest must not be negative")
	}
	cfg.HoldGCLimit = cmp.Or(cfg.HoldGCLimit, DefaultHoldGCLimit)
	cfg.StreamsPerConn = cmp.Or(cfg.StreamsPerConn, DefaultStreamsPerConn)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, DefaultProgressInterval)
	cfg.NodeID = cmp.Or(cfg.NodeID, DefaultNodeID)
	cfg.CertResource = cmp.Or(cfg.CertResource, DefaultCertResource)
	names := cfg.Resources
	if len(names) == 0 {
		names = []string{DefaultCertResource, DefaultRootResource}
	}
	cert := -1
	seen := map[string]bool{}
	for i, n := range names {
		if n == "" || seen[n] {
			return nil, fmt.Errorf("sdsload: resource names must be distinct and not empty: %q", names)
		}
		seen[n] = true
		if n == cfg.CertResource {
			cert = i
		}
	}
	if cert < 0 && cfg.Rotate != nil {
		return nil, fmt.Errorf("sdsload: rotation resource %q is not subscribed", cfg.CertResource)
	}
	if len(names) > 64 {
		return nil, errors.New("sdsload: at most 64 resources per stream")
	}
	abs, err := filepath.Abs(cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("sdsload: socket: %w", err)
	}
	l := &Loader{cfg: cfg, clock: clock.OrReal(cfg.Clock), log: cfg.Logger, names: names, cert: cert, addr: "unix://" + abs}
	l.log = logs.OrDiscard(l.log)
	return l, nil
}

// Report is the outcome of a run.
type Report struct {
	Streams     int
	Connections int
	Resources   []string
	// Ready counts the streams that received every resource, Failed those
	// that ended with an error before the run ended.
	Ready  int
	Failed int
	// TimeToReady summarises, over the ready streams, the time from
	// opening the stream to holding every resource. AllReady is the time
	// from the first stream opening to the last becoming ready.
	TimeToReady latency.Summary
	AllReady    time.Duration
	// GCCycles counts the garbage collections of this process (the load,
	// and the agent when it runs in the same process) from the first
	// stream opening until every stream was ready.
	GCCycles uint64
	// Slowest lists the Config.Slowest streams that took longest to be
	// ready, with where their time went.
	Slowest []StreamTiming
	// Memory is the agent's resident set size, when its PID is known.
	Memory *Memory
	// Rotation is set when a rotation was forced.
	Rotation *Rotation
}

// Memory is the agent's resident set size (VmRSS) in bytes.
type Memory struct {
	PID int
	// Before the streams opened, once they were all ready, and after the
	// rotation (0 when there was none).
	Before, After, AfterRotation uint64
}

// Rotation describes a forced rotation.
type Rotation struct {
	// Streams is the number of streams that were ready when the rotation
	// was forced; Rotated those that then received a new certificate.
	Streams int
	Rotated int
	// Latency summarises, per rotated stream, the time from the forced
	// rotation's request to the new certificate's arrival; All is the
	// time until the last stream had it.
	Latency latency.Summary
	All     time.Duration
}

// RSS returns the resident set size of process pid in bytes.
func RSS(pid int) (uint64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("sdsload: process %d: %w", pid, err)
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("sdsload: process %d: %w", pid, err)
	}
	return st.VmRSS, nil
}

// dial opens the connections and waits until each is ready, so that the
// time to ready measures SDS and not the connection handshakes. A Unix
// socket connects or fails at once, so the wait is bounded by ctx only.
func (l *Loader) dial(ctx context.Context) ([]*grpc.ClientConn, error) {
	n := (l.cfg.Streams + l.cfg.StreamsPerConn - 1) / l.cfg.StreamsPerConn
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(DefaultStreamWindow),
		grpc.WithInitialConnWindowSize(DefaultConnWindow),
	}, l.cfg.DialOptions...)
	conns := make([]*grpc.ClientConn, 0, n)
	for range n {
		c, err := grpc.NewClient(l.addr, opts...)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("sdsload: %w", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if err := waitReady(ctx, c); err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("sdsload: connecting to %s: %w", l.cfg.Socket, err)
		}
	}
	return conns, nil
}

func waitReady(ctx context.Context, c *grpc.ClientConn) error {
	c.Connect()
	for {
		switch s := c.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return errors.New("connection failed (is the agent serving on this socket?)")
		default:
			if !c.WaitForStateChange(ctx, s) {
				return ctx.Err()
			}
		}
	}
}
