package sdsserver

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/internal/logs"
)

// producer computes a stream's next response. nextLocked is called with the
// stream's mu held; it updates the stream's record of what was sent and
// returns nil when there is nothing to send.
type producer interface {
	nextLocked() any
}

// stream is the part of a SotW or delta stream that schedules sends. A
// stream has no goroutine of its own while idle: kick starts a sender
// goroutine when there is none, and it exits once nothing is left to send.
type stream struct {
	srv *Server
	gs  grpc.ServerStream
	p   producer
	api string // "sotw" or "delta", for logs

	mu        sync.Mutex
	closed    bool   // the handler is returning; send nothing more
	sending   bool   // a sender goroutine runs
	nonces    uint64 // responses sent
	lastNonce string // nonce of the latest response
	nodeSeen  bool   // the first request was handled
	spiffe    bool   // root secrets in the SPIFFE validator form
	node      string // the node ID of the first request, for logs
	warns     *logs.Throttle
	wg        sync.WaitGroup
}

func (s *stream) init(srv *Server, gs grpc.ServerStream, p producer, api string) {
	s.srv, s.gs, s.p, s.api = srv, gs, p, api
}

// logAttrs returns args with the stream's identity prepended. Streams keep
// no logger of their own: with 10,000 streams, every byte per stream counts.
func (s *stream) logAttrs(args ...any) []any {
	return append([]any{"api", s.api, "node", s.node}, args...)
}

// kick marks the stream as having something to send. It never blocks.
func (s *stream) kick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.sending {
		return // a running sender re-checks the state before it exits
	}
	s.sending = true
	s.wg.Add(1)
	go s.sendLoop()
}

// flush sends what is pending on the calling goroutine (the handler's),
// unless a sender goroutine already runs. Answering a request this way
// saves a goroutine hand-off on the path to the first response.
func (s *stream) flush() {
	s.mu.Lock()
	if s.closed || s.sending {
		s.mu.Unlock()
		return
	}
	s.sending = true
	s.wg.Add(1)
	s.mu.Unlock()
	s.sendLoop()
}

// subscribe subscribes the stream to names, each with its own Watch on the
// Source, and fetches their current secrets. install records the new subs
// in the stream's state (under mu) before the fetches, so that pushes that
// race with them are sent. Nothing is sent from here: the caller flushes.
func (s *stream) subscribe(names []string, install func([]*sub)) {
	subs := make([]*sub, len(names))
	for i, n := range names {
		sb := &sub{name: n, st: s}
		s.srv.hub.ref(n)
		// The Source calls notify without holding locks of ours, and
		// notify takes only the hub's lock and this stream's.
		sb.cancel = s.srv.src.Watch(n, sb.notify)
		subs[i] = sb
	}
	s.mu.Lock()
	install(subs)
	s.mu.Unlock()
	ctx := s.gs.Context()
	for _, sb := range subs {
		// A stream that ended (the client left, or Stop closed it) fetches
		// no further: shutdown does not wait for a long subscription list.
		if ctx.Err() != nil {
			return
		}
		sb.fetch(ctx)
	}
}

// unsubscribe cancels the Watches of subs and releases their cache
// entries. It is called without the stream's mu: a push takes it.
func (s *stream) unsubscribe(subs []*sub) {
	for _, sb := range subs {
		sb.cancel()
		s.srv.hub.unref(sb.name)
	}
}

func (s *stream) sendLoop() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		var msg any
		if !s.closed {
			msg = s.p.nextLocked()
		}
		if msg == nil {
			s.sending = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		// Only this goroutine sends, so SendMsg is never concurrent.
		if err := s.gs.SendMsg(msg); err != nil {
			s.mu.Lock()
			s.srv.log.Debug("SDS send failed; the stream is ending", s.logAttrs("error", err)...)
			s.sending = false
			s.closed = true
			s.mu.Unlock()
			return
		}
		s.srv.metrics.pushes.Inc()
	}
}

// newNonceLocked returns a fresh nonce for the next response.
func (s *stream) newNonceLocked() string {
	s.nonces++
	s.lastNonce = strconv.FormatUint(s.nonces, 10)
	return s.lastNonce
}

// checkType reports whether a request's type is Secret. An empty type is
// accepted: outside ADS the type is implied by the service.
func (s *stream) checkType(typeURL string) bool {
	if typeURL == "" || typeURL == SecretTypeURL {
		return true
	}
	s.srv.metrics.bad.WithLabelValues(reasonTypeURL).Inc()
	s.mu.Lock()
	s.warnLocked("ignoring SDS request for another type", "type_url", typeURL)
	s.mu.Unlock()
	return false
}

// firstRequest reads the node of the first request on the stream (the only
// one guaranteed to carry it).
func (s *stream) firstRequest(node *corev3.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeSeen {
		return
	}
	s.nodeSeen = true
	s.spiffe = wantsSPIFFE(node)
	s.node = node.GetId()
	if s.srv.debug() {
		s.srv.log.Debug("SDS stream opened", s.logAttrs("spiffe_validator", s.spiffe)...)
	}
}

// ackLocked accounts a request that carries the latest nonce: an ACK, or a
// NACK when it has error_detail. what describes the latest response.
func (s *stream) ackLocked(detail *status.Status, what ...any) {
	if detail == nil {
		s.srv.metrics.acks.Inc()
		return
	}
	s.srv.metrics.nacks.Inc()
	s.warnLocked("SDS client rejected a response (NACK); it is not sent again, only a newer version is",
		append([]any{"code", codes.Code(detail.GetCode()).String(), "error", detail.GetMessage()}, what...)...)
}

// staleLocked accounts a request whose nonce is not the latest.
func (s *stream) staleLocked(nonce string) {
	s.srv.metrics.stale.Inc()
	if s.srv.debug() {
		s.srv.log.Debug("stale SDS request", s.logAttrs("response_nonce", nonce, "latest_nonce", s.lastNonce)...)
	}
}

// unknownLocked accounts a subscribed name the Source does not know.
func (s *stream) unknownLocked(name string) {
	s.srv.metrics.bad.WithLabelValues(reasonUnknownResource).Inc()
	s.warnLocked("SDS client asked for an unknown resource", "resource", name)
}

// tooMany refuses a request naming more resources than the limit; the
// handler ends the stream with the error.
func (s *stream) tooMany(n int) error {
	s.srv.metrics.bad.WithLabelValues(reasonTooManyNames).Inc()
	err := s.srv.tooManyNames(n)
	s.mu.Lock()
	s.warnLocked("SDS request refused", "error", err)
	s.mu.Unlock()
	return err
}

// serve runs a stream's handler (StreamSecrets or DeltaSecrets): it counts
// the stream among the open ones, hands each request to handle until the
// client ends the stream, then calls end (which drops the subscriptions)
// and logs the end. h is the protocol's stream (an interface, not method
// values, so that serving allocates nothing more per stream).
func serve[Req any](st *stream, gs interface{ Recv() (Req, error) }, h interface {
	handle(Req) error
	end()
}) (err error) {
	st.srv.metrics.streams.Inc()
	defer func() {
		h.end()
		st.srv.metrics.streams.Dec()
		st.ended(err)
	}()
	for {
		req, err := gs.Recv()
		if err != nil {
			return recvEnd(err)
		}
		if err := h.handle(req); err != nil {
			return err
		}
	}
}

// ended logs the end of the stream.
func (s *stream) ended(err error) {
	if !s.srv.debug() {
		return
	}
	s.mu.Lock()
	args := s.logAttrs("error", err)
	s.mu.Unlock()
	s.srv.log.Debug("SDS stream closed", args...)
}

// close stops sending and waits for the sender goroutine. The caller then
// drops its subscriptions.
func (s *stream) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
}

// recvEnd turns the error that ended Recv into the handler's result.
func recvEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	if st, ok := grpcstatus.FromError(err); ok && st.Code() == codes.Canceled {
		return nil
	}
	return err
}

// wantsSPIFFE reads the SPIFFE validator switch from node metadata.
func wantsSPIFFE(node *corev3.Node) bool {
	v := node.GetMetadata().GetFields()[SPIFFEValidatorMetadataKey]
	switch k := v.GetKind().(type) {
	case *structpb.Value_BoolValue:
		return k.BoolValue
	case *structpb.Value_StringValue:
		return strings.EqualFold(k.StringValue, "true")
	}
	return false
}

// uniq returns names without duplicates and empty strings, in order. A
// map, not a scan of the earlier names: the scan made a 100,000-name
// request cost 32 s of CPU (the request size is capped as well).
func uniq(names []string) []string {
	out := make([]string, 0, len(names))
	seen := make(map[string]struct{}, len(names))
	for _, n := range names {
		if n == "" {
			continue
		}
		if _, dup := seen[n]; !dup {
			seen[n] = struct{}{}
			out = append(out, n)
		}
	}
	return out
}
