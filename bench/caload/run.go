package caload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/bench/latency"
	"github.com/meshid/meshid/internal/logs"
)

// RunAt runs the configured load with concurrency requests in flight. The
// Pregen keys are made first, outside the measured time. When ctx ends the
// run stops early and its report covers what completed; requests cut short
// by ctx are not counted.
func (l *Loader) RunAt(ctx context.Context, concurrency int) (*Report, error) {
	if concurrency <= 0 {
		return nil, fmt.Errorf("caload: concurrency %d must be positive", concurrency)
	}
	csrs, err := l.pregen(ctx)
	if err != nil {
		return nil, err
	}
	mds := make([]metadata.MD, len(l.cfg.Identities))
	for i, id := range l.cfg.Identities {
		if id.Token != "" {
			mds[i] = metadata.Pairs("authorization", "Bearer "+id.Token)
		}
	}

	r := &run{l: l, csrs: csrs, mds: mds, stop: make(chan struct{})}
	workers := make([]*worker, concurrency)
	for i := range workers {
		workers[i] = &worker{client: l.cfg.Clients[i%len(l.cfg.Clients)], errors: map[string]int{}, first: map[string]string{}}
		if l.cfg.Requests > 0 {
			workers[i].lat = latency.NewRecorder(l.cfg.Requests/concurrency + 1)
		} else {
			workers[i].lat = latency.NewRecorder(1024)
		}
	}

	server0, err := readCPU(l.cfg.ServerCPU)
	if err != nil {
		return nil, err
	}
	client0, err := readCPU(l.cfg.ClientCPU)
	if err != nil {
		return nil, err
	}
	start := l.clock.Now()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { r.work(ctx, w) })
	}
	finished := make(chan struct{})
	var bg sync.WaitGroup
	if l.cfg.Requests <= 0 {
		bg.Go(func() { r.stopAfter(ctx, l.cfg.Duration, finished) })
	}
	if l.cfg.Progress != nil {
		bg.Go(func() { r.report(concurrency, start, finished) })
	}
	wg.Wait()
	elapsed := l.clock.Now().Sub(start)
	server1, serr := readCPU(l.cfg.ServerCPU)
	client1, cerr := readCPU(l.cfg.ClientCPU)
	close(finished)
	bg.Wait()
	if err := errors.Join(serr, cerr); err != nil {
		return nil, err
	}

	rep := &Report{
		Concurrency: concurrency,
		KeyType:     string(l.cfg.KeyType),
		Pregen:      l.cfg.Pregen,
		Identities:  len(l.cfg.Identities),
		Elapsed:     elapsed,
		Errors:      map[string]int{},
		FirstErrors: map[string]string{},
		ServerCPU:   server1 - server0,
		ClientCPU:   client1 - client0,
	}
	all := latency.NewRecorder(0)
	for _, w := range workers {
		rep.Requests += w.done
		rep.OK += w.ok
		for c, n := range w.errors {
			rep.Errors[c] += n
			if _, seen := rep.FirstErrors[c]; !seen {
				rep.FirstErrors[c] = w.first[c]
			}
		}
		all.Merge(w.lat)
	}
	rep.Latency = all.Summary()
	if elapsed > 0 {
		rep.Throughput = float64(rep.OK) / elapsed.Seconds()
	}
	l.log.Debug("load finished", logs.KeyConcurrency, concurrency, logs.KeyRequests, rep.Requests, logs.KeyOk, rep.OK, logs.KeyElapsed, elapsed)
	return rep, r.err
}

// readCPU calls read, if set.
func readCPU(read func() (time.Duration, error)) (time.Duration, error) {
	if read == nil {
		return 0, nil
	}
	d, err := read()
	if err != nil {
		return 0, fmt.Errorf("caload: reading CPU time: %w", err)
	}
	return d, nil
}

// run is the shared state of one RunAt.
type run struct {
	l    *Loader
	csrs []string
	mds  []metadata.MD

	next     atomic.Int64 // index of the next request
	done, ok atomic.Int64 // for progress only
	stopOnce sync.Once
	stop     chan struct{}
	errOnce  sync.Once
	err      error // the first failure of the load itself (not of the CA)
}

// worker is one request loop's private state, merged when the run ends.
type worker struct {
	client Client
	lat    *latency.Recorder
	done   int
	ok     int
	errors map[string]int
	first  map[string]string // the first message of each code
}

// fail records the first failure of the load itself and stops the run.
func (r *run) fail(err error) {
	r.errOnce.Do(func() { r.err = err })
	r.halt()
}

func (r *run) halt() { r.stopOnce.Do(func() { close(r.stop) }) }

func (r *run) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// stopAfter ends the run after d, when ctx ends, or when finished closes.
func (r *run) stopAfter(ctx context.Context, d time.Duration, finished <-chan struct{}) {
	t := r.l.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	case <-finished:
	}
	r.halt()
}

// report calls Progress every interval until finished closes.
func (r *run) report(concurrency int, start time.Time, finished <-chan struct{}) {
	every := r.l.cfg.ProgressInterval
	t := r.l.clock.NewTimer(every)
	defer t.Stop()
	last, lastDone := start, int64(0)
	for {
		select {
		case <-finished:
			return
		case <-t.C():
		}
		now := r.l.clock.Now()
		done := r.done.Load()
		p := Progress{Concurrency: concurrency, Elapsed: now.Sub(start), Done: done, OK: r.ok.Load()}
		if dt := now.Sub(last); dt > 0 {
			p.Rate = float64(done-lastDone) / dt.Seconds()
		}
		last, lastDone = now, done
		r.l.cfg.Progress(p)
		t.Reset(every)
	}
}

func (r *run) work(ctx context.Context, w *worker) {
	cfg := &r.l.cfg
	n := int64(len(cfg.Identities))
	for !r.stopped() && ctx.Err() == nil {
		i := r.next.Add(1) - 1
		if cfg.Requests > 0 && i >= int64(cfg.Requests) {
			r.halt()
			return
		}
		who := int(i % n)
		var csr string
		if r.csrs != nil {
			csr = r.csrs[who]
		} else {
			pem, err := newCSR(cfg.KeyType, cfg.Identities[who].ID)
			if err != nil {
				r.fail(err)
				return
			}
			csr = pem
		}
		req := &securityapi.IstioCertificateRequest{
			Csr:              csr,
			ValidityDuration: int64(cfg.TTL / time.Second),
			Metadata:         r.l.meta,
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		if md := r.mds[who]; md != nil {
			rctx = metadata.NewOutgoingContext(rctx, md)
		}
		t0 := r.l.clock.Now()
		resp, err := w.client.CreateCertificate(rctx, req)
		d := r.l.clock.Now().Sub(t0)
		cancel()
		if ctx.Err() != nil {
			return // cut short by the caller: not a CA outcome
		}
		w.done++
		r.done.Add(1)
		if code := outcome(resp, err); code != "" {
			if w.errors[code]++; w.errors[code] == 1 {
				w.first[code] = message(err)
			}
			continue
		}
		w.ok++
		r.ok.Add(1)
		w.lat.Record(d)
	}
}
