package sdsserver

import (
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// sotwStream is one StreamSecrets call.
type sotwStream struct {
	stream
	subs []*sub // in subscription order; guarded by mu

	lastName, lastVersion string // content of the latest response, for NACK logs
}

// StreamSecrets serves the state-of-the-world SDS protocol.
func (s *Server) StreamSecrets(gs grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	st := &sotwStream{}
	st.init(s, gs, st, "sotw")
	return serve(&st.stream, gs, st)
}

func (st *sotwStream) handle(req *discoveryv3.DiscoveryRequest) error {
	st.firstRequest(req.GetNode())
	if !st.checkType(req.GetTypeUrl()) {
		return nil
	}
	// A SotW request is the stream's whole state: one cap bounds both.
	if n := len(req.GetResourceNames()); n > st.srv.maxNames {
		return st.tooMany(n)
	}
	want := uniq(req.GetResourceNames())

	st.mu.Lock()
	if n := req.GetResponseNonce(); n != "" {
		if n != st.lastNonce {
			// The client has not seen our latest response yet; it will
			// send its full state again when it has.
			st.staleLocked(n)
			st.mu.Unlock()
			return nil
		}
		st.ackLocked(req.GetErrorDetail(), "resource", st.lastName, "version", st.lastVersion)
	}
	wanted := make(map[string]bool, len(want))
	for _, n := range want {
		wanted[n] = false // not subscribed yet
	}
	var removed []*sub
	kept := st.subs[:0]
	for _, sb := range st.subs {
		if _, ok := wanted[sb.name]; ok {
			wanted[sb.name] = true
			kept = append(kept, sb)
		} else {
			removed = append(removed, sb)
		}
	}
	clear(st.subs[len(kept):])
	st.subs = kept
	var added []string
	for _, n := range want {
		if !wanted[n] {
			added = append(added, n)
		}
	}
	st.mu.Unlock()

	st.unsubscribe(removed)
	if len(added) == 0 {
		return nil
	}
	st.subscribe(added, func(subs []*sub) { st.subs = append(st.subs, subs...) })
	st.flush()
	return nil
}

// nextLocked returns a response for the first subscribed name whose current
// version was not sent yet, one resource per response.
func (st *sotwStream) nextLocked() any {
	now := st.srv.clock.Now()
	for _, sb := range st.subs {
		e := sb.cur.Load()
		switch {
		case e == nil:
			continue // not ready: sent when the Source reports it
		case e.unknown:
			if !sb.reported {
				sb.reported = true
				st.unknownLocked(sb.name)
			}
			continue
		case e.version == sb.sent || e.expired(now):
			continue
		}
		sb.sent = e.version
		st.lastName, st.lastVersion = sb.name, e.version
		return &discoveryv3.DiscoveryResponse{
			VersionInfo: e.version,
			Resources:   []*anypb.Any{e.resource(st.spiffe)},
			TypeUrl:     SecretTypeURL,
			Nonce:       st.newNonceLocked(),
		}
	}
	return nil
}

// end stops the stream and drops its subscriptions.
func (st *sotwStream) end() {
	st.close()
	st.mu.Lock()
	subs := st.subs
	st.subs = nil
	st.mu.Unlock()
	st.unsubscribe(subs)
}
