package sdsserver

import (
	"sort"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// deltaStream is one DeltaSecrets call.
type deltaStream struct {
	stream
	subs map[string]*sub // guarded by mu

	lastNames []string // names in the latest response, for NACK logs
}

// DeltaSecrets serves the incremental SDS protocol.
func (s *Server) DeltaSecrets(gs grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	st := &deltaStream{subs: map[string]*sub{}}
	st.init(s, gs, st, "delta")
	return serve(&st.stream, gs, st)
}

func (st *deltaStream) handle(req *discoveryv3.DeltaDiscoveryRequest) error {
	st.firstRequest(req.GetNode())
	if !st.checkType(req.GetTypeUrl()) {
		return nil
	}
	if n := len(req.GetResourceNamesSubscribe()); n > st.srv.maxNames {
		return st.tooMany(n)
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
	var removed []*sub
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if sb := st.subs[n]; sb != nil {
			delete(st.subs, n)
			removed = append(removed, sb)
		}
	}
	var added []string
	resend := false
	for _, n := range uniq(req.GetResourceNamesSubscribe()) {
		if sb := st.subs[n]; sb != nil {
			// Subscribing again asks for the resource again.
			sb.sent, sb.reported = initial[n], false
			resend = true
			continue
		}
		added = append(added, n)
	}
	total := len(st.subs) + len(added)
	st.mu.Unlock()

	st.unsubscribe(removed)
	// The stream's subscriptions stay within the cap too.
	if total > st.srv.maxNames {
		return st.tooMany(total)
	}
	if len(added) > 0 {
		st.subscribe(added, func(subs []*sub) {
			for _, sb := range subs {
				sb.sent = initial[sb.name]
				st.subs[sb.name] = sb
			}
		})
	}
	if resend || len(added) > 0 {
		st.flush()
	}
	return nil
}

// nextLocked returns one response with every subscribed resource whose
// current version the client does not hold, and every subscribed name that
// turned out unknown.
func (st *deltaStream) nextLocked() any {
	now := st.srv.clock.Now()
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: SecretTypeURL}
	for name, sb := range st.subs {
		e := sb.cur.Load()
		switch {
		case e == nil:
			continue
		case e.unknown:
			if !sb.reported {
				sb.reported, sb.sent = true, ""
				st.unknownLocked(name)
				resp.RemovedResources = append(resp.RemovedResources, name)
			}
			continue
		case e.version == sb.sent || e.expired(now):
			continue
		}
		sb.sent, sb.reported = e.version, false
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
	subs := make([]*sub, 0, len(st.subs))
	for _, sb := range st.subs {
		subs = append(subs, sb)
	}
	st.subs = nil
	st.mu.Unlock()
	st.unsubscribe(subs)
}
