package sdsserver_test

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/testkit"
)

// deltaClient drives a DeltaSecrets stream.
type deltaClient struct {
	t     testing.TB
	s     grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]
	node  *corev3.Node
	sent  bool
	nonce string // of the latest response
	// absent are names recvNames accepts in removed_resources: a name
	// that does not exist yet may be reported so (see env.later).
	absent map[string]bool
}

func newDelta(t testing.TB, c secretv3.SecretDiscoveryServiceClient, node *corev3.Node) *deltaClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	t.Cleanup(cancel)
	s, err := c.DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if node == nil {
		node = &corev3.Node{Id: "delta-node"}
	}
	return &deltaClient{t: t, s: s, node: node}
}

func (c *deltaClient) send(req *discoveryv3.DeltaDiscoveryRequest) {
	c.t.Helper()
	if !c.sent {
		req.Node = c.node
		c.sent = true
	}
	if req.TypeUrl == "" {
		req.TypeUrl = sdsserver.SecretTypeURL
	}
	if err := c.s.Send(req); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// change subscribes and unsubscribes, acknowledging the latest response.
func (c *deltaClient) change(sub, unsub []string) {
	c.t.Helper()
	c.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub, ResponseNonce: c.nonce})
}

func (c *deltaClient) recv() *discoveryv3.DeltaDiscoveryResponse {
	c.t.Helper()
	r, err := c.s.Recv()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	if r.GetNonce() == "" || r.GetTypeUrl() != sdsserver.SecretTypeURL {
		c.t.Fatalf("response lacks nonce or type: %v", r)
	}
	for _, res := range r.GetResources() {
		if res.GetVersion() == "" || res.GetName() != unpack(c.t, res.GetResource()).GetName() {
			c.t.Fatalf("resource %q without version or with another name inside", res.GetName())
		}
	}
	c.nonce = r.GetNonce()
	return r
}

// recvNames receives until every name arrived as a resource; it fails on
// any other resource or removal.
func (c *deltaClient) recvNames(names ...string) map[string]*discoveryv3.Resource {
	c.t.Helper()
	got := map[string]*discoveryv3.Resource{}
	for len(got) < len(names) {
		r := c.recv()
		for _, n := range r.GetRemovedResources() {
			if !c.absent[n] {
				c.t.Fatalf("unexpected removed_resources %v", r.GetRemovedResources())
			}
		}
		for _, res := range r.GetResources() {
			if !contains(names, res.GetName()) || got[res.GetName()] != nil {
				c.t.Fatalf("received %q, want %v once each", res.GetName(), names)
			}
			got[res.GetName()] = res
		}
	}
	return got
}

func secretOf(t testing.TB, r *discoveryv3.Resource) *tlsv3.Secret {
	t.Helper()
	return unpack(t, r.GetResource())
}

func TestDeltaSubscribeUnsubscribe(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, publish := e.later(t)
		publish()
		c := newDelta(t, h.client, nil)
		c.change([]string{dflt, root}, nil)
		got := c.recvNames(dflt, root)
		chain, key := tlsCert(t, secretOf(t, got[dflt]))
		verifySVID(t, chain, key, trustedCA(t, secretOf(t, got[root])))

		// Unsubscribing needs no answer; subscribing to later in the same
		// request tells us when it was handled.
		c.change([]string{later}, []string{root})
		c.recvNames(later)
		if n := e.watchers(root); n != 0 {
			t.Errorf("%d watches on ROOTCA after unsubscribing", n)
		}
		e.rootChange(t)
		e.rotate(t)
		r := c.recv()
		for _, res := range r.GetResources() {
			if res.GetName() != dflt {
				t.Errorf("got %q after unsubscribing it", res.GetName())
			}
		}
		if len(r.GetResources()) == 0 || len(r.GetRemovedResources()) != 0 {
			t.Errorf("want the new default only, got %v removed %v", r.GetResources(), r.GetRemovedResources())
		}
	})
}

func TestDeltaUnknownNameIsRemoved(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		c := newDelta(t, h.client, nil)
		c.change([]string{"no-such-secret"}, nil)
		r := c.recv()
		if len(r.GetResources()) != 0 || len(r.GetRemovedResources()) != 1 || r.GetRemovedResources()[0] != "no-such-secret" {
			t.Fatalf("got resources %v removed %v, want removed [no-such-secret]", r.GetResources(), r.GetRemovedResources())
		}
		h.wantMetric(t, 1, "meshid_agent_sds_bad_requests_total", "reason", "unknown_resource")
		// The stream stays up.
		c.change([]string{dflt}, nil)
		c.recvNames(dflt)
	})
}

func TestDeltaInitialResourceVersions(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		a := newDelta(t, h.client, nil)
		a.change([]string{dflt}, nil)
		held := a.recvNames(dflt)[dflt].GetVersion()

		// A reconnecting client holding the current default gets only
		// ROOTCA, then the next default.
		b := newDelta(t, h.client, nil)
		b.send(&discoveryv3.DeltaDiscoveryRequest{
			ResourceNamesSubscribe:  []string{dflt, root},
			InitialResourceVersions: map[string]string{dflt: held, root: "some-old-version"},
		})
		b.recvNames(root)
		b.change(nil, nil) // ACK
		e.rotate(t)
		r := b.recvNames(dflt)
		if r[dflt].GetVersion() == held {
			t.Fatal("default sent again with the version the client holds")
		}
	})
}

func TestDeltaNameThatDoesNotExistYet(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, publish := e.later(t)
		c := newDelta(t, h.client, nil)
		c.absent = map[string]bool{later: true}
		c.change([]string{later, dflt}, nil)
		c.recvNames(dflt)
		c.change(nil, nil)
		publish()
		c.recvNames(later)
	})
}

func TestDeltaNACKAndStaleNonce(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		later, publish := e.later(t)
		publish()
		c := newDelta(t, h.client, nil)
		c.change([]string{dflt}, nil)
		c.recvNames(dflt)
		// A NACK that also subscribes to later: the answer carries later
		// only, not the rejected default again.
		c.send(&discoveryv3.DeltaDiscoveryRequest{
			ResponseNonce: c.nonce, ResourceNamesSubscribe: []string{later},
			ErrorDetail: &rpcstatus.Status{Code: 3, Message: "test: rejected"},
		})
		c.recvNames(later)
		h.wantMetric(t, 1, "meshid_agent_sds_nacks_total")
		// A subscription in a request with an old nonce still applies.
		old := c.nonce
		e.rotate(t)
		c.recvNames(dflt)
		c.send(&discoveryv3.DeltaDiscoveryRequest{ResponseNonce: old, ResourceNamesSubscribe: []string{root}})
		c.recvNames(root)
		h.wantMetric(t, 1, "meshid_agent_sds_stale_requests_total")
		h.wantMetric(t, 0, "meshid_agent_sds_acks_total")
	})
}

func TestDeltaWrongTypeAndSPIFFE(t *testing.T) {
	e := fakeEnv(t)
	h := start(t, e.src)
	c := newDelta(t, h.client, spiffeNode(structpb.NewBoolValue(true)))
	c.send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.listener.v3.Listener", ResourceNamesSubscribe: []string{dflt}})
	c.change([]string{root}, nil)
	got := c.recvNames(root)
	checkSPIFFEValidator(t, secretOf(t, got[root]), e.roots())
	h.wantMetric(t, 1, "meshid_agent_sds_bad_requests_total", "reason", "type_url")
	// Subscribing again to a name asks for it again.
	c.change([]string{root}, nil)
	c.recvNames(root)
}
