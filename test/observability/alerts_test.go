package observability_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// rulesFile is the alerts file users load (the chart ships the same file).
var rulesFile = filepath.Join("..", "..", "deploy", "observability", "meshid-alerts.yaml")

// alert is one alerting rule of the file.
type alert struct{ name, expr string }

// loadAlerts parses the rules file with Prometheus's own parser and
// validator (rulefmt, strict: an unknown field fails), as Prometheus does
// when it loads the file.
func loadAlerts(t *testing.T) []alert {
	t.Helper()
	rgs := parseRules(t, rulesFile)
	var out []alert
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: rule %q is not an alert", g.Name, r.Record)
				continue
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want a severity label, a summary and a description", r.Alert)
			}
			out = append(out, alert{r.Alert, r.Expr})
		}
	}
	return out
}

// parseRules parses a rules file as Prometheus does when it loads it
// (rulefmt, strict: an unknown field fails), failing the test on an error.
func parseRules(t *testing.T, file string) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rulefmt: %v", errors.Join(errs...))
	}
	return rgs
}

func TestRulesFileRejectsABadExpression(t *testing.T) {
	// The parser is not lenient: the same file with a broken expression
	// does not load.
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(data), "meshid_agent_cert_expiry_seconds < 3600", "meshid_agent_cert_expiry_seconds < ", 1)
	if bad == string(data) {
		t.Fatal("the agent expiry expression was not found in the rules file")
	}
	if _, errs := rulefmt.Parse([]byte(bad), false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler)); len(errs) == 0 {
		t.Fatal("a broken expression parsed")
	}
}

// scenario is a timeline of scrapes and the alerts that must fire at its
// end (by alert: the pods of the series it yields; "" for series without a
// pod label, such as sums by namespace).
type scenario struct {
	name string
	tl   timeline
	want map[string][]string
}

// TestAlerts evaluates every alert of the rules file with Prometheus's
// PromQL engine on scrapes of real CAs and agents, in a healthy cluster,
// near the root's expiry, and in trouble; each alert fires exactly where
// it should, and each fires in some scenario.
func TestAlerts(t *testing.T) {
	alerts := loadAlerts(t)
	healthy, rootNotAfter := healthyTimeline(t)
	scenarios := []scenario{
		{name: "healthy", tl: healthy.shifted(time.Now())},
		{name: "root expires in 40 days", tl: healthy.shifted(rootNotAfter.Add(-40 * 24 * time.Hour))},
		{name: "root expires in 10 days", tl: healthy.shifted(rootNotAfter.Add(-10 * 24 * time.Hour)), want: map[string][]string{
			"MeshidRootExpiringSoon":   {"meshid-0"},
			"MeshidCACertExpiringSoon": {"meshid-0"},
		}},
		{name: "trouble", tl: troubleTimeline(t).shifted(time.Now()), want: map[string][]string{
			"MeshidCAFailureRatioHigh":   {""},
			"MeshidCARateLimitStorm":     {""},
			"MeshidCAConnectionsRefused": {""},
			// Not lost-0, which has no certificate yet (its gauge is NaN).
			"MeshidAgentCertExpiringSoon":   {"short-0"},
			"MeshidCAUnreachableFromAgents": {"lost-0"},
			"MeshidFederatedBundleStale":    {"meshid-0"},
			// The test upstream's root lives 48h.
			"MeshidRootExpiringSoon": {"upstream-0"},
			// Not meshid-0, which has no upstream; upstream-0's
			// intermediate (2h) is not MeshidCACertExpiringSoon's.
			"MeshidUpstreamIntermediateExpiring": {"upstream-0"},
			"MeshidUpstreamMintFailing":          {"upstream-0"},
		}},
	}
	fired := map[string]bool{}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ev := newEvaluator(t, sc.tl)
			for _, a := range alerts {
				got := ev.firing(a.expr)
				var pods []string
				for _, s := range got {
					pods = append(pods, podOf(s))
				}
				slices.Sort(pods)
				if want := sc.want[a.name]; !slices.Equal(pods, want) {
					t.Errorf("%s yields %q, want series of pods %q", a.name, got, want)
				}
				if len(got) > 0 {
					fired[a.name] = true
				}
			}
			for name := range sc.want {
				if !slices.ContainsFunc(alerts, func(a alert) bool { return a.name == name }) {
					t.Errorf("no alert %s in %s", name, rulesFile)
				}
			}
		})
	}
	for _, a := range alerts {
		if !fired[a.name] {
			t.Errorf("%s fires in no scenario: its expression is untested", a.name)
		}
	}
}

// podOf is the pod label of a series printed as {a="b", ...}=value.
func podOf(series string) string {
	_, rest, ok := strings.Cut(series, `pod="`)
	if !ok {
		return ""
	}
	pod, _, _ := strings.Cut(rest, `"`)
	return pod
}

// healthyTimeline: a CA and an agent holding its 24h certificate, a
// client signing 20 certificates between two scrapes a minute apart (in
// the timeline; the scrapes are taken right after each other). It returns
// the CA's root expiry too.
func healthyTimeline(t *testing.T) (timeline, time.Time) {
	ctx := context.Background()
	c := startCA(t, "meshid-0", caserver.Config{})
	web, webT, _ := runAgent(t, "web-0", c.srv.Addr().String(), c.rootFile(), c.tokenFile(t, "shop", "web"), 0, nil)
	if _, err := fetch(t, web); err != nil {
		t.Fatal(err)
	}
	var tl timeline
	start := time.Now()
	tl.add(start, record(t, c.target, webT))
	cl := c.client(t, c.tokenFile(t, "shop", "cart"))
	for range 20 {
		if _, _, err := cl.Sign(ctx, csr(t, "shop", "cart"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	tl.add(start.Add(time.Minute), record(t, c.target, webT))
	return tl, c.roots()[0].NotAfter
}

// troubleTimeline: between two scrapes a minute apart, a CA with a rate
// limit of 1/s rate-limits a client in a loop 400 times, refuses 50 requests
// with a bad token and closes 400 connections over its per-IP limit; one agent
// holds a 30-minute certificate, another cannot reach its CA at all.
func troubleTimeline(t *testing.T) timeline {
	ctx := context.Background()
	// A federated trust domain whose bundle endpoint is gone: its bundle
	// is never refreshed.
	peer := spiffefed.Peer{TrustDomain: spiffeid.RequireTrustDomainFromString("gone.example"), URL: "https://" + closedAddr(t) + "/", Profile: spiffefed.ProfileWeb}
	c := startCA(t, "meshid-0", caserver.Config{Limits: caserver.LimitsConfig{Rate: 1, Burst: 1, MaxConnectionsPerIP: 3}, Federation: caserver.FederationConfig{Peers: []spiffefed.Peer{peer}}})
	short, shortT, _ := runAgent(t, "short-0", c.srv.Addr().String(), c.rootFile(), c.tokenFile(t, "shop", "short"), 30*time.Minute, nil)
	if s, err := fetch(t, short); err != nil || time.Until(s.NotAfter) > 30*time.Minute {
		t.Fatalf("short-lived agent: %v, %v", s, err)
	}
	clk := clock.NewFake(time.Now())
	lost, lostT, lostReg := runAgent(t, "lost-0", closedAddr(t), c.rootFile(), c.tokenFile(t, "shop", "lost"), 0, clk)
	if _, err := fetch(t, lost); err == nil {
		t.Fatal("an agent without a CA got a certificate")
	}
	waitFor(t, "the lost agent's first failure", func() bool {
		return counter(t, lostReg, "meshid_agent_rotation_failures_total", "code", "Unavailable") >= 1
	})
	hammer := c.client(t, c.tokenFile(t, "shop", "hammer"))
	if _, _, err := hammer.Sign(ctx, csr(t, "shop", "hammer"), time.Hour); err != nil {
		t.Fatal(err)
	}
	bad := c.client(t, writeFile(t, "not-a-token"))
	if _, _, err := bad.Sign(ctx, csr(t, "shop", "bad"), time.Hour); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("bad token: %v, want Unauthenticated", err)
	}

	upT := upstreamDown(t)

	var tl timeline
	start := time.Now()
	tl.add(start, record(t, c.target, shortT, lostT, upT))

	// Two scrapes a minute apart in a 5m window: rate() is about
	// increase/200s, so a storm of more than 1/s needs over 200 in between.
	limited := 0
	for range 400 {
		if _, _, err := hammer.Sign(ctx, csr(t, "shop", "hammer"), time.Hour); status.Code(err) == codes.ResourceExhausted {
			limited++
		}
	}
	if limited < 390 {
		t.Fatalf("%d of 400 requests rate-limited at 1/s", limited)
	}
	for range 50 {
		if _, _, err := bad.Sign(ctx, csr(t, "shop", "bad"), time.Hour); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("bad token: %v, want Unauthenticated", err)
		}
	}
	// The short agent, hammer and bad hold the 3 connections allowed from
	// 127.0.0.1: every further one is closed at once.
	for range 400 {
		conn, err := net.Dial("tcp", c.srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	waitFor(t, "400 refused connections", func() bool {
		return counter(t, c.reg, "meshid_ca_connections_refused_total", "reason", "per_ip_limit") >= 400
	})
	// The lost agent retries after its backoff, and fails again.
	clk.Add(time.Minute)
	waitFor(t, "the lost agent's retry", func() bool {
		return counter(t, lostReg, "meshid_agent_rotation_failures_total", "code", "Unavailable") >= 2
	})
	tl.add(start.Add(time.Minute), record(t, c.target, shortT, lostT, upT))
	return tl
}

// upstreamDown is a CA (pod upstream-0) whose intermediate a real cfssl
// serve minted for 2h, renewed at half; cfssl is then stopped and the
// CA's clock moved to 80% of the life: every renewal since failed.
func upstreamDown(t *testing.T) target {
	t.Helper()
	cf := testkit.StartCFSSL(t, 2*time.Hour)
	u, err := upstream.ParseURL("cfssl+https://" + cf.Addr + "?profile=" + testkit.CFSSLProfileCA + "&ca=" + cf.TLSCAFile)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	c := startCA(t, "upstream-0", caserver.Config{Clock: clk,
		Upstream: caserver.UpstreamConfig{URL: u, CredentialsFile: cf.KeyFile, Lifetime: 2 * time.Hour}})
	cf.Stop()
	in := c.srv.Authority().Bundle().Cert
	clk.Set(in.NotBefore.Add(in.NotAfter.Sub(in.NotBefore) * 8 / 10))
	waitFor(t, "the upstream CA's failed renewal", func() bool {
		st, _ := c.srv.UpstreamStatus()
		return st.Failures > 0
	})
	return c.target
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
