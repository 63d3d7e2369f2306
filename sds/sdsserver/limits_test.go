package sdsserver_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// The attack: one request, or one stream, naming tens of thousands of
// resources. Each request and each stream is capped at
// DefaultMaxResourceNames; above it the request is refused with
// ResourceExhausted (a stream ends), at it it is served.
func TestResourceNamesCapped(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e *env, h *harness) {
		const max = sdsserver.DefaultMaxResourceNames
		// At the cap: served, the unknown names ignored.
		c := newSotw(t, h.client, nil)
		c.request(append(names("unknown", max-1), dflt)...)
		if s := c.recvSecret(); s.GetName() != dflt {
			t.Fatalf("got %q", s.GetName())
		}
		// Above: the stream ends with ResourceExhausted.
		c.request(append(names("unknown", max), dflt)...)
		if _, err := c.s.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("SotW above the cap: %v, want ResourceExhausted", err)
		}

		// Delta: one request above the cap, and a stream that would
		// exceed it over several requests.
		d := newDelta(t, h.client, nil)
		d.send(&discoveryv3.DeltaDiscoveryRequest{ResourceNamesSubscribe: names("a", max+1)})
		if _, err := d.s.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("delta above the cap: %v, want ResourceExhausted", err)
		}
		d = newDelta(t, h.client, nil)
		d.change([]string{dflt}, nil)
		d.recvNames(dflt)
		d.change(names("b", max/2), nil)
		d.recv() // the unknown names, removed
		d.change(names("c", max/2), nil)
		if _, err := d.s.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("delta stream above the cap: %v, want ResourceExhausted", err)
		}

		ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
		defer cancel()
		_, err := h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: append(names("unknown", max), dflt)})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("FetchSecrets above the cap: %v, want ResourceExhausted", err)
		}
		h.wantMetric(t, 4, "meshid_agent_sds_bad_requests_total", "reason", "too_many_names")
		// Every refused stream released what it held.
		testkit.Until(t, "the cache to drop the refused streams' names", func() bool { return sdsserver.CachedNames(h.srv) == 0 })
	})
}

// Every name a stream subscribed to is released when it unsubscribes or
// ends: the server's cache, the Manager's topics and its file entries.
func TestSubscriptionsFreed(t *testing.T) {
	p := newPKI(t, nil)
	m := newManager(t, p, nil)
	h := start(t, m)
	dir := t.TempDir()
	path := filepath.Join(dir, "root.pem")
	if err := certs.WriteFileAtomic(path, certs.EncodeCertificates(p.roots()...), 0o600); err != nil {
		t.Fatal(err)
	}
	topics0, files0 := m.Held()
	t.Chdir(dir)
	// The clean spellings of one file, absent files, unknown names, and
	// refused spellings.
	spellings := []string{secretcache.FileRootPrefix + path, secretcache.FileRootPrefix + "root.pem", secretcache.FileRootPrefix + "./root.pem"}
	ns := append([]string(nil), spellings...)
	for i := range 50 {
		ns = append(ns,
			secretcache.FileRootPrefix+filepath.Join(dir, fmt.Sprintf("absent-%d.pem", i)),
			fmt.Sprintf("unknown-%d", i),
			secretcache.FileRootPrefix+dir+strings.Repeat("/.", i+1)+"/root.pem")
	}
	c := newSotw(t, h.client, nil)
	c.request(append(ns, dflt)...)
	c.recvNamed(append(spellings, dflt)...)
	if n := sdsserver.CachedNames(h.srv); n != len(ns)+1 {
		t.Fatalf("cache holds %d names, want %d", n, len(ns)+1)
	}
	if topics, files := m.Held(); topics-topics0 != 54 || files-files0 != 51 {
		t.Fatalf("Manager holds %d topics and %d files, want 54 (default, 3 spellings, 50 absent files) and 51 (one file, 50 absent)", topics-topics0, files-files0)
	}
	c.request(dflt)
	testkit.Until(t, "the unsubscribed names to be freed", func() bool {
		topics, files := m.Held()
		return sdsserver.CachedNames(h.srv) == 1 && topics == topics0+1 && files == files0
	})
	c.s.CloseSend()
	testkit.Until(t, "the ended stream's names to be freed", func() bool {
		topics, _ := m.Held()
		return sdsserver.CachedNames(h.srv) == 0 && topics == topics0
	})
}

// The attack: 20,000 NACKs (or unknown names) on one stream made 19,017
// warning lines. Warnings are rate-limited per stream, and the count of
// those left out is logged with the next one; the metrics count them all.
func TestWarningsRateLimited(t *testing.T) {
	e := fakeEnv(t)
	clk := clock.NewFake(time.Now())
	h := start(t, e.src, withClock(clk))
	const nacks = 20000
	c := h.withDefault(t)
	for range nacks {
		c.nack()
	}
	// 2,000 names that are unknown, each asked for once.
	for i := range 2000 {
		c.request(dflt, fmt.Sprintf("unknown-%d", i))
	}
	c.request(dflt, root) // a request handled after all of them
	c.recvSecret()
	all := h.logs.Count("SDS client")
	if n := h.metric(t, "meshid_agent_sds_nacks_total"); n != nacks {
		t.Fatalf("nacks = %v, want %d", n, nacks)
	}
	if all > sdsserver.WarnBurst {
		t.Fatalf("%d warning lines for %d NACKs and 2000 unknown names, want at most %d", all, nacks, sdsserver.WarnBurst)
	}
	// A minute later one more line, which counts what was left out.
	clk.Add(time.Minute)
	c.nack()
	h.logs.WaitForContaining(t, "suppressed=", 1)
	// Another stream has its own budget.
	before := h.logs.Count("SDS client rejected")
	d := h.withDefault(t)
	d.nack()
	h.logs.WaitFor(t, "SDS client rejected", before+1)
}
