package sds

import (
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// sotwStream is one StreamSecrets call.
type sotwStream struct {
	stream
	subs []*sotwSub // in subscription order; guarded by mu

	lastName, lastVersion string // content of the latest response, for NACK logs
}

// sotwSub is a subscribed name.
type sotwSub struct {
	t             *topic
	sent          string // version sent on this stream
	unknownLogged bool
}

// StreamSecrets serves the state-of-the-world SDS protocol.
func (s *Server) StreamSecrets(gs grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	st := &sotwStream{}
	st.init(s, gs, st, "sotw")
	return serve(&st.stream, gs, st)
}

func (st *sotwStream) handle(req *discoveryv3.DiscoveryRequest) {
	st.firstRequest(req.GetNode())
	if !st.checkType(req.GetTypeUrl()) {
		return
	}
	want := uniq(req.GetResourceNames())

	st.mu.Lock()
	if n := req.GetResponseNonce(); n != "" {
		if n != st.lastNonce {
			// The client has not seen our latest response yet; it will
			// send its full state again when it has.
			st.staleLocked(n)
			st.mu.Unlock()
			return
		}
		st.ackLocked(req.GetErrorDetail(), "resource", st.lastName, "version", st.lastVersion)
	}
	var removed []*topic
	kept := st.subs[:0]
	for _, sub := range st.subs {
		if contains(want, sub.t.name) {
			kept = append(kept, sub)
		} else {
			removed = append(removed, sub.t)
		}
	}
	clear(st.subs[len(kept):])
	st.subs = kept
	var added []string
	for _, n := range want {
		if st.findLocked(n) == nil {
			added = append(added, n)
		}
	}
	st.mu.Unlock()

	// Topics are (un)subscribed without holding mu: a topic's push takes
	// the topic's lock and then ours.
	for _, t := range removed {
		st.srv.hub.unsubscribe(t, st)
	}
	if len(added) == 0 {
		return
	}
	st.subscribeAll(st, added, func(ts []*topic) {
		for _, t := range ts {
			st.subs = append(st.subs, &sotwSub{t: t})
		}
	})
	st.flush()
}

func (st *sotwStream) findLocked(name string) *sotwSub {
	for _, sub := range st.subs {
		if sub.t.name == name {
			return sub
		}
	}
	return nil
}

// nextLocked returns a response for the first subscribed name whose current
// version was not sent yet, one resource per response.
func (st *sotwStream) nextLocked() any {
	now := st.srv.clock.Now()
	for _, sub := range st.subs {
		e := sub.t.cur.Load()
		switch {
		case e == nil:
			continue // not ready: sent when the Source reports it
		case e.unknown:
			if !sub.unknownLogged {
				sub.unknownLogged = true
				st.unknownLocked(sub.t.name)
			}
			continue
		case e.version == sub.sent || e.expired(now):
			continue
		}
		sub.sent = e.version
		st.lastName, st.lastVersion = e.name, e.version
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
	for _, sub := range subs {
		st.srv.hub.unsubscribe(sub.t, st)
	}
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}
