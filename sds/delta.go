package sds

import (
	"sort"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// deltaStream is one DeltaSecrets call.
type deltaStream struct {
	stream
	subs map[string]*deltaSub // guarded by mu

	lastNames []string // names in the latest response, for NACK logs
}

// deltaSub is a subscribed name.
type deltaSub struct {
	t           *topic
	has         string // the version the client holds ("" = none)
	removedSent bool   // the name was reported in removed_resources
}

// DeltaSecrets serves the incremental SDS protocol.
func (s *Server) DeltaSecrets(gs grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	st := &deltaStream{subs: map[string]*deltaSub{}}
	st.init(s, gs, st, "delta")
	return serve(&st.stream, gs, st)
}

func (st *deltaStream) handle(req *discoveryv3.DeltaDiscoveryRequest) {
	st.firstRequest(req.GetNode())
	if !st.checkType(req.GetTypeUrl()) {
		return
	}
	initial := req.GetInitialResourceVersions()

	st.mu.Lock()
	// Unlike SotW, a delta request is a change, not a state: a stale nonce
	// only means it does not acknowledge our latest response, and its
	// (un)subscriptions still apply.
	if n := req.GetResponseNonce(); n != "" {
		if n == st.lastNonce {
			st.ackLocked(req.GetErrorDetail(), "resources", st.lastNames)
		} else {
			st.staleLocked(n)
		}
	}
	var removed []*topic
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if sub := st.subs[n]; sub != nil {
			delete(st.subs, n)
			removed = append(removed, sub.t)
		}
	}
	var added []string
	resend := false
	for _, n := range uniq(req.GetResourceNamesSubscribe()) {
		if sub := st.subs[n]; sub != nil {
			// Subscribing again asks for the resource again.
			sub.has, sub.removedSent = initial[n], false
			resend = true
			continue
		}
		added = append(added, n)
	}
	st.mu.Unlock()

	for _, t := range removed {
		st.srv.hub.unsubscribe(t, st)
	}
	if len(added) > 0 {
		st.subscribeAll(st, added, func(ts []*topic) {
			for _, t := range ts {
				st.subs[t.name] = &deltaSub{t: t, has: initial[t.name]}
			}
		})
	}
	if resend || len(added) > 0 {
		st.flush()
	}
}

// nextLocked returns one response with every subscribed resource whose
// current version the client does not hold, and every subscribed name that
// turned out unknown.
func (st *deltaStream) nextLocked() any {
	now := st.srv.clock.Now()
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: SecretTypeURL}
	for name, sub := range st.subs {
		e := sub.t.cur.Load()
		switch {
		case e == nil:
			continue
		case e.unknown:
			if !sub.removedSent {
				sub.removedSent, sub.has = true, ""
				st.unknownLocked(name)
				resp.RemovedResources = append(resp.RemovedResources, name)
			}
			continue
		case e.version == sub.has || e.expired(now):
			continue
		}
		sub.has, sub.removedSent = e.version, false
		resp.Resources = append(resp.Resources, e.deltaResource(st.spiffe))
	}
	if len(resp.Resources) == 0 && len(resp.RemovedResources) == 0 {
		return nil
	}
	// Stable order for clients and logs.
	sort.Slice(resp.Resources, func(i, j int) bool { return resp.Resources[i].Name < resp.Resources[j].Name })
	sort.Strings(resp.RemovedResources)
	st.lastNames = st.lastNames[:0]
	for _, r := range resp.Resources {
		st.lastNames = append(st.lastNames, r.Name)
	}
	if len(resp.Resources) == 1 {
		resp.SystemVersionInfo = resp.Resources[0].Version
	}
	resp.Nonce = st.newNonceLocked()
	return resp
}

// end stops the stream and drops its subscriptions.
func (st *deltaStream) end() {
	st.close()
	st.mu.Lock()
	subs := st.subs
	st.subs = nil
	st.mu.Unlock()
	for _, sub := range subs {
		st.srv.hub.unsubscribe(sub.t, st)
	}
}
