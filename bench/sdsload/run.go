package sdsload

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/protobuf/proto"

	"github.com/meshid/meshid/bench/latency"
	"github.com/meshid/meshid/internal/logs"
)

// SecretTypeURL is the xDS type of SDS resources.
var SecretTypeURL = "type.googleapis.com/" + string(proto.MessageName(&tlsv3.Secret{}))

// Run opens the streams, waits until each holds every resource, forces a
// rotation if configured and waits until it reached every stream, then closes
// the streams. On a timeout it returns the report so far and an error.
func (l *Loader) Run(ctx context.Context) (*Report, error) {
	rep := &Report{Streams: l.cfg.Streams, Resources: l.names}
	if l.cfg.HoldGC {
		defer holdGC(l.cfg.HoldGCLimit)()
	}
	if l.cfg.PID > 0 {
		rss, err := RSS(l.cfg.PID)
		if err != nil {
			return nil, err
		}
		rep.Memory = &Memory{PID: l.cfg.PID, Before: rss}
	}
	conns, err := l.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	rep.Connections = len(conns)

	sctx, stop := context.WithCancel(ctx)
	t := newTracker(l.cfg.Streams, l.clock.Now())
	var sem chan struct{}
	if l.cfg.OpenConcurrency > 0 {
		sem = make(chan struct{}, l.cfg.OpenConcurrency)
	}
	var streams, bg sync.WaitGroup
	finished := make(chan struct{})
	defer func() {
		stop()
		streams.Wait()
		close(finished)
		bg.Wait()
	}()
	if l.cfg.Progress != nil {
		bg.Go(func() { l.progress(t, finished) })
	}
	// One context per connection: thousands of streams deriving their
	// contexts from a single parent contend on that parent's lock.
	cctxs := make([]context.Context, len(conns))
	for i := range cctxs {
		var cancel context.CancelFunc
		cctxs[i], cancel = context.WithCancel(sctx)
		defer cancel()
	}
	gc0 := gcCycles()
	start := l.clock.Now()
	open := func(i int) {
		c := i / l.cfg.StreamsPerConn
		client := secretv3.NewSecretDiscoveryServiceClient(conns[c])
		streams.Go(func() { l.stream(cctxs[c], t, sem, i, client) })
	}
	if sem == nil {
		for i := range l.cfg.Streams {
			open(i)
		}
	} else {
		// A stream's goroutine starts when a slot is free, in order. With
		// a goroutine per stream parked on the slots from the start, the
		// first streams shared the CPUs with thousands of goroutines
		// starting and parking, and the collection of their stacks: the
		// 9-20 ms maximum of every --open-concurrency 1 run.
		streams.Go(func() {
			for i := range l.cfg.Streams {
				select {
				case sem <- struct{}{}:
				case <-sctx.Done():
					return
				}
				open(i)
			}
		})
	}

	werr := l.wait(ctx, t.open.all, "every stream to be ready")
	rep.GCCycles = gcCycles() - gc0
	t.mu.Lock()
	rep.Ready, rep.Failed = t.open.reached, t.failed
	rep.TimeToReady = latency.Summarize(append([]time.Duration(nil), t.open.lat...))
	rep.Slowest = t.slowest(l.cfg.Slowest, start)
	if t.open.reached > 0 {
		rep.AllReady = t.open.last.Sub(start)
	}
	t.mu.Unlock()
	if werr != nil {
		return rep, werr
	}
	if rep.Memory != nil {
		if rep.Memory.After, err = RSS(l.cfg.PID); err != nil {
			return rep, err
		}
	}
	if l.cfg.Rotate == nil {
		return rep, nil
	}

	t0 := l.clock.Now()
	t.arm(t0)
	if err := l.cfg.Rotate(ctx); err != nil {
		return rep, fmt.Errorf("sdsload: forcing a rotation: %w", err)
	}
	werr = l.wait(ctx, t.rot.all, "the rotation to reach every stream") // arm set it
	t.mu.Lock()
	rot := &Rotation{Streams: t.rot.want, Rotated: t.rot.reached}
	rot.Latency = latency.Summarize(append([]time.Duration(nil), t.rot.lat...))
	if t.rot.reached > 0 {
		rot.All = t.rot.last.Sub(t0)
	}
	rep.Failed = t.failed
	t.mu.Unlock()
	rep.Rotation = rot
	if werr != nil {
		return rep, werr
	}
	if rep.Memory != nil {
		if rep.Memory.AfterRotation, err = RSS(l.cfg.PID); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// wait waits for done, ctx or the timeout.
func (l *Loader) wait(ctx context.Context, done <-chan struct{}, what string) error {
	timer := l.clock.NewTimer(l.cfg.Timeout)
	defer timer.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sdsload: waiting for %s: %w", what, ctx.Err())
	case <-timer.C():
		return fmt.Errorf("sdsload: timed out after %v waiting for %s", l.cfg.Timeout, what)
	}
}

func (l *Loader) progress(t *tracker, finished <-chan struct{}) {
	every := l.cfg.ProgressInterval
	timer := l.clock.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-finished:
			return
		case <-timer.C():
		}
		now := l.clock.Now()
		t.mu.Lock()
		p := Progress{Phase: t.phase, Elapsed: now.Sub(t.phaseStart), Streams: t.n,
			Ready: t.open.reached, Failed: t.failed, Rotated: t.rot.reached}
		t.mu.Unlock()
		l.cfg.Progress(p)
		timer.Reset(every)
	}
}

// stream runs one SDS stream until ctx ends or the stream fails. With
// OpenConcurrency, it holds a slot of sem (taken by Run) until it is ready.
func (l *Loader) stream(ctx context.Context, t *tracker, sem chan struct{}, i int, client secretv3.SecretDiscoveryServiceClient) {
	release := func() {
		if sem != nil {
			<-sem
			sem = nil
		}
	}
	defer release()
	fail := func(err error) {
		if ctx.Err() == nil {
			l.log.Debug("stream failed", logs.KeyStream, i, logs.KeyError, err)
			t.fail(i)
		}
	}

	ph := phases{start: l.clock.Now(), gc: gcCycles()}
	t0 := ph.start
	s, err := client.StreamSecrets(ctx)
	if err != nil {
		fail(err)
		return
	}
	ph.opened = l.clock.Now()
	req := &discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: fmt.Sprintf("%s-%d", l.cfg.NodeID, i)},
		TypeUrl:       SecretTypeURL,
		ResourceNames: l.names,
	}
	if err := s.Send(req); err != nil {
		fail(err)
		return
	}
	ph.sent = l.clock.Now()
	want := uint64(1)<<len(l.names) - 1
	var have uint64
	ready := false
	var secret tlsv3.Secret
	for {
		resp, err := s.Recv()
		if err != nil {
			fail(err)
			return
		}
		now := l.clock.Now()
		if ph.first.IsZero() {
			ph.first = now
		}
		for _, a := range resp.GetResources() {
			if err := a.UnmarshalTo(&secret); err != nil {
				fail(fmt.Errorf("resource: %w", err))
				return
			}
			for k, n := range l.names {
				if secret.GetName() != n {
					continue
				}
				have |= 1 << k
				if k == l.cert {
					t.content(i, fingerprint(&secret, a.GetValue()), now)
				}
			}
		}
		if have == want && !ready {
			ready = true
			ph.gc = gcCycles() - ph.gc
			t.readyAt(i, now.Sub(t0), now, ph)
			release()
		}
		ack := &discoveryv3.DiscoveryRequest{
			TypeUrl: SecretTypeURL, ResourceNames: l.names,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(),
		}
		if err := s.Send(ack); err != nil {
			fail(err)
			return
		}
	}
}
