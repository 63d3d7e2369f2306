package sdsserver_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
)

// Modes of FuzzDiscoveryRequest: which of the server's three entry points
// receives the fuzzed request.
const (
	fuzzSotw = iota
	fuzzDelta
	fuzzFetch
	fuzzModes
)

// FuzzDiscoveryRequest sends a request with fuzzed resource names, nonce,
// version, type URL and NACK to a real Server on a real Unix socket, on a
// StreamSecrets stream, a DeltaSecrets stream or FetchSecrets. On a stream
// it then subscribes a probe name (unguessable) and reads until the probe
// arrives, which proves the stream still works after the fuzzed request.
// Properties:
//   - the server never panics or ends a stream because of a request;
//   - every response has the Secret type URL, a fresh nonce (increasing
//     per stream) and a version, and carries only names that were
//     subscribed by a request it accepted (a type URL other than Secret or
//     empty is ignored; a SotW request with a stale nonce is ignored) and
//     that the Source knows; delta removals name only unknown names;
//   - FetchSecrets answers with exactly the distinct non-empty names asked
//     for, in order, or InvalidArgument (wrong type, no names) or NotFound
//     (an unknown name).
func FuzzDiscoveryRequest(f *testing.F) {
	p := newPKI(f, nil)
	src := newFakeSource()
	src.set(p.certSecret(f, secretcache.DefaultName, time.Hour))
	src.set(p.rootSecret(secretcache.RootName))
	h := start(f, src, quiet)
	known := func(name string) bool { return name == secretcache.DefaultName || name == secretcache.RootName }

	names := func(ns ...string) string { return strings.Join(ns, "\n") }
	for _, s := range []struct {
		mode                           uint8
		typeURL, names, nonce, version string
		nack, spiffe                   bool
	}{
		{fuzzSotw, sdsserver.SecretTypeURL, names("default", "ROOTCA"), "", "", false, false},
		{fuzzSotw, "", names("default", "default", ""), "", "", false, true},
		{fuzzSotw, sdsserver.SecretTypeURL, names("default"), "1", "v1", true, false},
		{fuzzSotw, "type.googleapis.com/envoy.config.cluster.v3.Cluster", names("default"), "", "", false, false},
		{fuzzSotw, sdsserver.SecretTypeURL, names("nope", "file-cert:/nonexistent/cert.pem~/nonexistent/key.pem"), "", "", false, false},
		{fuzzSotw, sdsserver.SecretTypeURL, "", "", "", false, false},
		{fuzzDelta, sdsserver.SecretTypeURL, names("default", "ROOTCA", "nope"), "", "", false, true},
		{fuzzDelta, "", names("ROOTCA"), "7", "stale", true, false},
		{fuzzDelta, "bogus", names("default"), "", "", false, false},
		{fuzzFetch, sdsserver.SecretTypeURL, names("ROOTCA", "default", "ROOTCA"), "", "", false, false},
		{fuzzFetch, "", names("nope"), "", "", false, false},
		{fuzzFetch, "bogus", names("default"), "", "", false, false},
		{fuzzFetch, sdsserver.SecretTypeURL, "", "", "", false, true},
		{fuzzSotw, sdsserver.SecretTypeURL, strings.Repeat("x\n", 300), "", "", false, false},
	} {
		f.Add(s.mode, s.typeURL, s.names, s.nonce, s.version, s.nack, s.spiffe)
	}

	probes := 0
	f.Fuzz(func(t *testing.T, mode uint8, typeURL, nameList, nonce, version string, nack, spiffe bool) {
		// The fake Source reports each cancelled watch on a buffered
		// channel; drain it so that a long run never blocks an unsubscribe.
		defer func() {
			for len(src.cancels) > 0 {
				<-src.cancels
			}
		}()
		// Proto3 strings are UTF-8: the Go client refuses to marshal
		// anything else, and a server receiving it fails the stream's
		// Recv (grpc-go validates on unmarshal). Invalid bytes become
		// U+FFFD so that the rest of the input is still exercised.
		typeURL, nameList, nonce, version = validUTF8(typeURL), validUTF8(nameList), validUTF8(nonce), validUTF8(version)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		reqNames := strings.Split(nameList, "\n")
		node := &corev3.Node{Id: "sidecar~10.0.0.1~fuzz.default~default.svc.cluster.local"}
		if spiffe {
			node = spiffeNode(structpb.NewBoolValue(true))
		}
		var detail *rpcstatus.Status
		if nack {
			detail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "fuzz: rejected"}
		}
		typeOK := typeURL == "" || typeURL == sdsserver.SecretTypeURL
		distinct := distinctNames(reqNames)
		// More names than the cap (in one request, or on a delta stream
		// once the probe is added) end the stream with ResourceExhausted.
		tooMany := len(reqNames) > sdsserver.DefaultMaxResourceNames

		if mode%fuzzModes == fuzzFetch {
			resp, err := h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{
				Node: node, TypeUrl: typeURL, ResourceNames: reqNames, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: detail,
			})
			checkFetch(t, resp, err, typeOK, tooMany, distinct, known)
			return
		}

		probes++
		var rnd [8]byte
		rand.Read(rnd[:])
		probe := fmt.Sprintf("probe-%d-%s", probes, hex.EncodeToString(rnd[:]))
		src.set(p.rootSecret(probe))
		// Names a response may carry: the probe, and what the fuzzed
		// request subscribed if the server had to accept it.
		// (A SotW request with a nonce is stale and ignored.)
		allowed := map[string]bool{probe: true}
		if typeOK && (mode%fuzzModes != fuzzSotw || nonce == "") {
			for _, n := range distinct {
				allowed[n] = true
			}
		}
		if mode%fuzzModes == fuzzSotw {
			s, err := h.client.StreamSecrets(ctx)
			if err != nil {
				t.Fatal(err)
			}
			send := mustSend(t, s.Send)
			send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: reqNames, VersionInfo: version, ResponseNonce: nonce, ErrorDetail: detail})
			if typeOK && tooMany {
				expectExhausted(t, func() error { _, err := s.Recv(); return err })
				return
			}
			send(&discoveryv3.DiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNames: []string{probe}})
			untilProbe(t, s.Recv, func(r *discoveryv3.DiscoveryResponse) bool {
				if r.GetTypeUrl() != sdsserver.SecretTypeURL || r.GetVersionInfo() == "" || len(r.GetResources()) != 1 {
					t.Fatalf("response type %q version %q with %d resources", r.GetTypeUrl(), r.GetVersionInfo(), len(r.GetResources()))
				}
				name := unpack(t, r.GetResources()[0]).GetName()
				if !allowed[name] || name != probe && !known(name) {
					t.Fatalf("response carries %q; allowed %v", name, allowed)
				}
				return name == probe
			})
			s.CloseSend()
			return
		}

		s, err := h.client.DeltaSecrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		send := mustSend(t, s.Send)
		initial := map[string]string{}
		if len(reqNames) > 0 && version != "" {
			initial[reqNames[0]] = version
		}
		send(&discoveryv3.DeltaDiscoveryRequest{
			Node: node, TypeUrl: typeURL, ResourceNamesSubscribe: reqNames, ResourceNamesUnsubscribe: reqNames[len(reqNames)/2:],
			InitialResourceVersions: initial, ResponseNonce: nonce, ErrorDetail: detail,
		})
		if typeOK && (tooMany || len(distinct)+1 > sdsserver.DefaultMaxResourceNames) {
			expectExhausted(t, func() error {
				if !tooMany { // the probe's subscription is the one over the cap
					send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNamesSubscribe: []string{probe}})
				}
				for {
					if _, err := s.Recv(); err != nil {
						return err
					}
				}
			})
			return
		}
		send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: sdsserver.SecretTypeURL, ResourceNamesSubscribe: []string{probe}})
		untilProbe(t, s.Recv, func(r *discoveryv3.DeltaDiscoveryResponse) (got bool) {
			if r.GetTypeUrl() != sdsserver.SecretTypeURL || len(r.GetResources())+len(r.GetRemovedResources()) == 0 {
				t.Fatalf("response type %q with %d resources", r.GetTypeUrl(), len(r.GetResources()))
			}
			for _, res := range r.GetResources() {
				if !allowed[res.GetName()] || res.GetName() != probe && !known(res.GetName()) || res.GetVersion() == "" {
					t.Fatalf("response carries %q version %q; allowed %v", res.GetName(), res.GetVersion(), allowed)
				}
				if unpack(t, res.GetResource()).GetName() != res.GetName() {
					t.Fatalf("resource %q holds secret %q", res.GetName(), unpack(t, res.GetResource()).GetName())
				}
				got = got || res.GetName() == probe
			}
			for _, n := range r.GetRemovedResources() {
				if !allowed[n] || known(n) || n == probe {
					t.Fatalf("response removes %q", n)
				}
			}
			return got
		})
		s.CloseSend()
	})
}

// mustSend returns send that fails t when the stream's Send fails.
func mustSend[R any](t *testing.T, send func(R) error) func(R) {
	return func(r R) {
		t.Helper()
		if err := send(r); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
}

// untilProbe reads responses with recv until check reports the probe
// arrived, failing t when the stream ends first or a nonce is not fresh.
func untilProbe[R interface{ GetNonce() string }](t *testing.T, recv func() (R, error), check func(R) bool) {
	t.Helper()
	last := uint64(0)
	for got := false; !got; {
		r, err := recv()
		if err != nil {
			t.Fatalf("recv before the probe arrived: %v", err)
		}
		last = checkNonce(t, r.GetNonce(), last)
		got = check(r)
	}
}

// expectExhausted fails unless recv ends the stream with ResourceExhausted.
func expectExhausted(t *testing.T, recv func() error) {
	t.Helper()
	if err := recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request over the name cap: %v, want ResourceExhausted", err)
	}
}

func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// distinctNames is the set of names a request subscribes: distinct and
// non-empty, in order.
func distinctNames(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// checkNonce fails unless nonce is a fresh nonce of the stream, after last.
func checkNonce(t *testing.T, nonce string, last uint64) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(nonce, 10, 64)
	if err != nil || n <= last {
		t.Fatalf("nonce %q after %d", nonce, last)
	}
	return n
}

// checkFetch checks a FetchSecrets answer to a request for distinct names.
func checkFetch(t *testing.T, resp *discoveryv3.DiscoveryResponse, err error, typeOK, tooMany bool, distinct []string, known func(string) bool) {
	t.Helper()
	allKnown := true
	for _, n := range distinct {
		allKnown = allKnown && known(n)
	}
	var want codes.Code
	switch {
	case !typeOK:
		want = codes.InvalidArgument
	case tooMany:
		want = codes.ResourceExhausted
	case len(distinct) == 0:
		want = codes.InvalidArgument
	case !allKnown:
		want = codes.NotFound
	}
	if got := status.Code(err); got != want {
		t.Fatalf("FetchSecrets: code %v, want %v (%v)", got, want, err)
	}
	if err != nil {
		return
	}
	if resp.GetTypeUrl() != sdsserver.SecretTypeURL || resp.GetNonce() == "" || len(resp.GetResources()) != len(distinct) {
		t.Fatalf("FetchSecrets: type %q nonce %q, %d resources for %v", resp.GetTypeUrl(), resp.GetNonce(), len(resp.GetResources()), distinct)
	}
	for i, a := range resp.GetResources() {
		if got := unpack(t, a).GetName(); got != distinct[i] {
			t.Fatalf("FetchSecrets: resource %d is %q, want %q", i, got, distinct[i])
		}
	}
}
