package storm_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// TestRenewalJitterSpreads gives 10,000 agents a certificate at the same
// instant (one fake clock that does not move) and reads when each agent's
// scheduler will renew it: the deadline of the timer it parks on. With the
// default grace ratio 0.5 and ±1% jitter, every renewal lies within ±1% of
// the lifetime around the middle, the renewals cover that window rather
// than a few instants, and no second of it holds more than 0.5% of them (a
// uniform spread puts 10,000/1,728 ≈ 6 in each second of a 24h lifetime's
// ±864s window).
func TestRenewalJitterSpreads(t *testing.T) {
	const (
		agents    = 10000
		ttl       = 24 * time.Hour
		maxPerSec = agents / 200 // 0.5%
	)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	authority := newAuthority(t, clk, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	t.Cleanup(func() { cancel(); runs.Wait() })

	managers := make([]*secretcache.Manager, agents)
	for i := range managers {
		id := spiffeid.RequireFromSegments(td, "ns", "storm", "sa", fmt.Sprintf("sa-%d", i%100))
		m, err := secretcache.New(managerConfig(t, testkit.AuthoritySigner{Authority: authority, ID: id, Caller: "storm"}, id, ttl, clk))
		if err != nil {
			t.Fatal(err)
		}
		managers[i] = m
		runs.Go(func() { m.Run(ctx) })
	}
	// Every agent gets its first certificate now, two at a time (the
	// machine's CPUs), all at the same fake instant.
	work := make(chan *secretcache.Manager)
	var issue sync.WaitGroup
	errs := make(chan error, agents)
	for range 2 {
		issue.Go(func() {
			for m := range work {
				if _, err := m.Secret(ctx, secretcache.DefaultName); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, m := range managers {
		work <- m
	}
	close(work)
	issue.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !clk.WaitForWaiters(agents, guard(t, time.Minute)) {
		t.Fatalf("only %d of %d schedulers parked", clk.Waiters(), agents)
	}

	first, err := managers[0].Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	notBefore, notAfter := first.Chain[0].NotBefore, first.NotAfter
	life := notAfter.Sub(notBefore)
	mid := notBefore.Add(life / 2)
	lo, hi := mid.Add(-life/100), mid.Add(life/100)

	deadlines := clk.Deadlines()
	if len(deadlines) != agents {
		t.Fatalf("%d timers pending, want one per agent (%d)", len(deadlines), agents)
	}
	perSecond := map[int64]int{}
	for _, d := range deadlines {
		if d.Before(lo) || d.After(hi) {
			t.Fatalf("renewal at %s, outside the ±1%% window [%s, %s]", d.Sub(notBefore), lo.Sub(notBefore), hi.Sub(notBefore))
		}
		perSecond[d.Unix()]++
	}
	busiest, busiestAt := 0, int64(0)
	for s, n := range perSecond {
		if n > busiest {
			busiest, busiestAt = n, s
		}
	}
	spread := deadlines[len(deadlines)-1].Sub(deadlines[0])
	// Each tenth of the window holds 10% of the renewals, give or take 2%.
	tenths := make([]int, 10)
	for _, d := range deadlines {
		tenths[min(9, int(10*d.Sub(lo)/hi.Sub(lo)))]++
	}
	t.Logf("%d renewals of certificates issued at the same instant (lifetime %s): spread over %s of the ±%s window, %d distinct seconds, busiest second %d (%.2f%%) at %s after issuance, per tenth of the window %v",
		agents, life, spread.Round(time.Second), life/100, len(perSecond), busiest, 100*float64(busiest)/agents,
		time.Unix(busiestAt, 0).Sub(notBefore), tenths)
	if spread < life*19/1000 {
		t.Errorf("renewals spread over %s, want nearly the whole ±1%% window (%s)", spread, life/50)
	}
	if busiest > maxPerSec {
		t.Errorf("%d renewals (%.2f%%) fall in one second, want at most %d (0.5%%)", busiest, 100*float64(busiest)/agents, maxPerSec)
	}
	sort.Ints(tenths)
	if tenths[0] < agents*8/100 || tenths[9] > agents*12/100 {
		t.Errorf("renewals per tenth of the window %v, want each within 10%% ± 2%% of %d", tenths, agents)
	}
}
