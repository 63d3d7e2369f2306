package rotation_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// memStore is a rotation.Store in memory that reports each save.
type memStore struct{ saved chan []byte }

func newMemStore() *memStore { return &memStore{saved: make(chan []byte, 64)} }

func (s *memStore) Save(_ context.Context, data []byte) error {
	s.saved <- data
	return nil
}

// last waits for the save of a record in phase and returns it.
func (s *memStore) last(t *testing.T, phase rotation.Phase) []byte {
	t.Helper()
	guard := time.NewTimer(testkit.Guard)
	defer guard.Stop()
	for {
		select {
		case data := <-s.saved:
			var rec rotation.Record
			if err := json.Unmarshal(data, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Phase == phase.String() {
				return data
			}
		case <-guard.C:
			t.Fatalf("no record in phase %v saved within %v", phase, testkit.Guard)
		}
	}
}

// persisted returns a world whose rotation saves to a memStore.
func persisted(t *testing.T, initial *keystore.Bundle, mod func(*rotation.Config)) (*world, *memStore) {
	t.Helper()
	st := newMemStore()
	return newWorld(t, initial, func(c *rotation.Config) {
		c.Store = st
		if mod != nil {
			mod(c)
		}
	}), st
}

// A server restarted in each phase of a plugged CA's rotation keeps every
// root until its retirement: the restarted rotation is given the CA its
// files hold then (the old one while stable, the new one once the files
// were replaced), and the saved record.
func TestRestartInEachPhase(t *testing.T) {
	oldR := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	oldCA, newCA := oldR.intermediate(t, "old"), newR.intermediate(t, "new")
	const down = 3 * time.Minute // the restart's downtime

	t.Run("stable", func(t *testing.T) {
		w, st := persisted(t, oldCA, nil)
		rec := st.last(t, rotation.Stable)
		w2, _ := persisted(t, oldCA, nil)
		if err := w2.rot.Restore(rec); err != nil {
			t.Fatal(err)
		}
		if s := w2.rot.Status(); s.Phase != rotation.Stable || len(s.Roots) != 1 || s.Stuck != "" {
			t.Fatalf("restored %v with %d roots, stuck %q", s.Phase, len(s.Roots), s.Stuck)
		}
		_ = w
	})

	t.Run("prepared, files replaced", func(t *testing.T) {
		w, st := persisted(t, oldCA, nil)
		st.last(t, rotation.Stable)
		if err := w.rot.SetBundle(newCA); err != nil {
			t.Fatal(err)
		}
		rec := st.last(t, rotation.Prepared)
		// The restart: the files hold the new CA, the old key is gone.
		w2, st2 := persisted(t, newCA, nil)
		w2.clk.Set(t0.Add(down))
		if err := w2.rot.Restore(rec); err != nil {
			t.Fatal(err)
		}
		s := w2.rot.Status()
		if s.Phase != rotation.Active || !s.Signing.Equal(newCA.Cert) {
			t.Fatalf("restored %v, signing %q", s.Phase, s.Signing.Subject)
		}
		// The old CA may have signed until the restart: its root stays a
		// whole RetireAfter from then.
		retireAt := t0.Add(down + retireAfter)
		wantRoots(t, w2, []string{"new root", "old root"})
		if s.NextStep != "retire" || !s.NextStepAt.Equal(retireAt) {
			t.Fatalf("next %s at %v, want retire at %v", s.NextStep, s.NextStepAt, retireAt)
		}
		st2.last(t, rotation.Active) // the restored state is saved again
		retiresAt(t, w2, retireAt, []string{"new root"})
	})

	t.Run("prepared, same CA prepared again", func(t *testing.T) {
		// A self-signed root kept in <state-dir>/next is offered again
		// after the restart: it keeps its propagation clock.
		w, st := persisted(t, oldCA, nil)
		w.clk.Set(t0.Add(time.Minute))
		if err := w.rot.SetBundle(newCA); err != nil {
			t.Fatal(err)
		}
		rec := st.last(t, rotation.Prepared)
		w2, _ := persisted(t, oldCA, nil)
		w2.clk.Set(t0.Add(down))
		if err := w2.rot.SetBundle(newCA); err != nil {
			t.Fatal(err)
		}
		if err := w2.rot.Restore(rec); err != nil {
			t.Fatal(err)
		}
		s := w2.rot.Status()
		if want := t0.Add(time.Minute + propagation); s.Phase != rotation.Prepared || !s.ActivateAt.Equal(want) || !s.Since.Equal(t0.Add(time.Minute)) {
			t.Fatalf("restored %v, activate at %v since %v; want prepared, %v", s.Phase, s.ActivateAt, s.Since, want)
		}
		w2.clk.Set(t0.Add(time.Minute + propagation))
		if s := w2.waitPhase(t, rotation.Active); !s.Signing.Equal(newCA.Cert) {
			t.Fatalf("signing %q after the propagation", s.Signing.Subject)
		}
	})

	t.Run("active", func(t *testing.T) {
		w, st := persisted(t, oldCA, nil)
		if err := w.rot.SetBundle(newCA); err != nil {
			t.Fatal(err)
		}
		w.clk.Set(t0.Add(time.Minute))
		if err := w.rot.Activate(); err != nil {
			t.Fatal(err)
		}
		rec := st.last(t, rotation.Active)
		w2, _ := persisted(t, newCA, nil)
		w2.clk.Set(t0.Add(down))
		if err := w2.rot.Restore(rec); err != nil {
			t.Fatal(err)
		}
		// The saved retirement time, not a new one from the restart.
		retireAt := t0.Add(time.Minute + retireAfter)
		if s := w2.rot.Status(); s.Phase != rotation.Active || !s.NextStepAt.Equal(retireAt) || !s.Since.Equal(t0.Add(time.Minute)) {
			t.Fatalf("restored %v, next step at %v since %v; want active, retire at %v", s.Phase, s.NextStepAt, s.Since, retireAt)
		}
		retiresAt(t, w2, retireAt, []string{"new root"})
	})

	t.Run("files changed while down", func(t *testing.T) {
		// Stable on the old CA, restarted on a new root: the old root
		// is kept as if the new CA had just been activated.
		_, st := persisted(t, oldCA, nil)
		rec := st.last(t, rotation.Stable)
		w2, _ := persisted(t, newCA, nil)
		w2.clk.Set(t0.Add(down))
		if err := w2.rot.Restore(rec); err != nil {
			t.Fatal(err)
		}
		retiresAt(t, w2, t0.Add(down+retireAfter), []string{"new root"})
	})
}

// retiresAt checks that the bundle keeps its roots until at, and holds
// want from at on.
func retiresAt(t *testing.T, w *world, at time.Time, want []string) {
	t.Helper()
	before := subjects(w.auth.Bundle().Roots)
	if d := w.parked(t); !d.Equal(at) {
		t.Fatalf("Run wakes at %v, want %v", d, at)
	}
	w.clk.Set(at.Add(-time.Nanosecond))
	if got := subjects(w.auth.Bundle().Roots); !slices.Equal(got, before) {
		t.Fatalf("roots %q before %v, want %q", got, at, before)
	}
	w.clk.Set(at)
	w.waitPhase(t, rotation.Stable)
	wantRoots(t, w, want)
}

func wantRoots(t *testing.T, w *world, want []string) {
	t.Helper()
	if got := subjects(w.auth.Bundle().Roots); !slices.Equal(got, want) {
		t.Fatalf("roots %q, want %q", got, want)
	}
}

// A record that cannot be vouched for is refused whole, with a reason; the
// rotation is stuck and drops nothing: the CA loaded and the roots given
// as Retiring stay.
func TestRestoreRefusesBadRecords(t *testing.T) {
	oldR := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newCA := newR.intermediate(t, "new")
	w, st := persisted(t, oldR.intermediate(t, "old"), nil)
	if err := w.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	good := st.last(t, rotation.Prepared)
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	leaf := w.leaf(t).Leaf
	many := make([]any, rotation.MaxRecordRoots+1)
	for i := range many {
		many[i] = map[string]any{"pem": string(certs.EncodeCertificates(oldR.cert)), "state": "current"}
	}
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"garbage":        {[]byte("{not json"), "not a rotation record"},
		"empty":          {nil, "not a rotation record"},
		"huge":           {[]byte(`{"version":1,"pad":"` + strings.Repeat("x", rotation.MaxRecordSize) + `"}`), "more than"},
		"version":        {edit(func(m map[string]any) { m["version"] = 2 }), "version 2"},
		"unknown field":  {edit(func(m map[string]any) { m["extra"] = true }), "unknown field"},
		"trailing":       {append(slices.Clone(good), []byte(`{}`)...), "trailing"},
		"phase":          {edit(func(m map[string]any) { m["phase"] = "retired" }), "unknown phase"},
		"phase mismatch": {edit(func(m map[string]any) { m["phase"] = "stable" }), "does not match"},
		"no roots":       {edit(func(m map[string]any) { m["roots"] = []any{} }), "0 roots"},
		"too many roots": {edit(func(m map[string]any) { m["roots"] = many }), "17 roots"},
		"bad pem":        {edit(func(m map[string]any) { m["roots"].([]any)[0].(map[string]any)["pem"] = "junk" }), "not one PEM certificate"},
		"leaf as root": {edit(func(m map[string]any) {
			m["roots"].([]any)[0].(map[string]any)["pem"] = string(certs.EncodeCertificates(leaf))
		}), "not a CA certificate"},
		"state": {edit(func(m map[string]any) { m["roots"].([]any)[0].(map[string]any)["state"] = "trusted" }), "unknown state"},
		"retiring without time": {edit(func(m map[string]any) {
			m["roots"].([]any)[0].(map[string]any)["state"] = "retiring"
		}), "without a retirement time"},
	} {
		t.Run(name, func(t *testing.T) {
			// The restarted server loaded the new CA, and the old root
			// from a root-cert.pem union as Retiring.
			w2, _ := persisted(t, newCA, func(c *rotation.Config) { c.Retiring = []*x509.Certificate{oldR.cert} })
			err := w2.rot.Restore(tc.data)
			if !errors.Is(err, rotation.ErrRecordRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore: %v, want ErrRecordRefused saying %q", err, tc.want)
			}
			s := w2.rot.Status()
			if s.Stuck == "" || !s.Signing.Equal(newCA.Cert) || !s.NextStepAt.Equal(t0.Add(retireAfter)) {
				t.Fatalf("after a refused record: stuck %q, signing %q, next step at %v", s.Stuck, s.Signing.Subject, s.NextStepAt)
			}
			wantRoots(t, w2, []string{"new root", "old root"})
		})
	}
}

// A retirement time beyond RetireAfter from now (a record edited to keep
// an old root trusted for years) is cut to RetireAfter; a root that
// expired meanwhile is left out.
func TestRestoreBoundsRetirement(t *testing.T) {
	oldR := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	gone := newRoot(t, "expired root", t0.Add(-2*time.Hour), time.Hour)
	newCA := newR.intermediate(t, "new")
	rec := rotation.Record{
		Version: 1, Phase: "active", PhaseSince: t0, Signing: "elsewhere",
		Roots: []rotation.RecordRoot{
			{PEM: string(certs.EncodeCertificates(newR.cert)), State: rotation.RootCurrent},
			{PEM: string(certs.EncodeCertificates(oldR.cert)), State: rotation.RootRetiring, RetireAt: t0.Add(100 * 365 * 24 * time.Hour)},
			{PEM: string(certs.EncodeCertificates(gone.cert)), State: rotation.RootRetiring, RetireAt: t0.Add(time.Hour)},
		},
	}
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := persisted(t, newCA, nil)
	if err := w.rot.Restore(data); err != nil {
		t.Fatal(err)
	}
	wantRoots(t, w, []string{"new root", "old root"})
	if s := w.rot.Status(); !s.NextStepAt.Equal(t0.Add(retireAfter)) {
		t.Fatalf("old root retires at %v, want %v", s.NextStepAt, t0.Add(retireAfter))
	}
}

// Two replicas follow one clock: the one that prepared the CA later
// activates it at the leader's time, whether the leader's record arrives
// before or after it sees the CA; an old root retires at the later of the
// two times, and a root only the leader still trusts is trusted by both.
func TestFollowSharesTheLeadersClock(t *testing.T) {
	oldR := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	oldCA, newCA := oldR.intermediate(t, "old"), newR.intermediate(t, "new")
	leader, st := persisted(t, oldCA, nil)
	if err := leader.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	rec := st.last(t, rotation.Prepared)
	leaderAt := t0.Add(propagation)

	// The follower saw the Secret 40s later: its own clock is later.
	late, _ := persisted(t, oldCA, nil)
	late.clk.Set(t0.Add(40 * time.Second))
	if err := late.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	if err := late.rot.Follow(rec); err != nil {
		t.Fatal(err)
	}
	if s := late.rot.Status(); !s.ActivateAt.Equal(leaderAt) {
		t.Fatalf("follower activates at %v, want the leader's %v", s.ActivateAt, leaderAt)
	}
	late.clk.Set(leaderAt)
	late.waitPhase(t, rotation.Active)

	// The record first, then the Secret.
	early, _ := persisted(t, oldCA, nil)
	early.clk.Set(t0.Add(20 * time.Second))
	if err := early.rot.Follow(rec); err != nil {
		t.Fatal(err)
	}
	if err := early.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	if s := early.rot.Status(); !s.ActivateAt.Equal(leaderAt) {
		t.Fatalf("follower activates at %v, want the leader's %v", s.ActivateAt, leaderAt)
	}

	// Activation: the leader at its time, the follower 5s later (its
	// timer); the follower's retirement is the later and wins on both
	// sides: the leader adopts it from the follower's record.
	leader.clk.Set(leaderAt)
	leader.waitPhase(t, rotation.Active)
	active := st.last(t, rotation.Active)
	early.clk.Set(leaderAt.Add(5 * time.Second))
	early.waitPhase(t, rotation.Active)
	if err := early.rot.Follow(active); err != nil {
		t.Fatal(err)
	}
	if s := early.rot.Status(); !s.NextStepAt.Equal(leaderAt.Add(5*time.Second + retireAfter)) {
		t.Fatalf("follower retires at %v, want its own later time", s.NextStepAt)
	}

	// A replica that never saw the old CA (it started on the new one)
	// trusts the old root the leader still trusts.
	fresh, _ := persisted(t, newCA, nil)
	fresh.clk.Set(leaderAt.Add(time.Minute))
	if err := fresh.rot.Follow(active); err != nil {
		t.Fatal(err)
	}
	wantRoots(t, fresh, []string{"new root", "old root"})
	if s := fresh.rot.Status(); !s.NextStepAt.Equal(leaderAt.Add(retireAfter)) {
		t.Fatalf("fresh replica retires the old root at %v, want the leader's %v", s.NextStepAt, leaderAt.Add(retireAfter))
	}

	// A refused record changes nothing.
	if err := fresh.rot.Follow([]byte("{}")); !errors.Is(err, rotation.ErrRecordRefused) {
		t.Fatalf("Follow of a bad record: %v", err)
	}
	wantRoots(t, fresh, []string{"new root", "old root"})

	// The same record 10,000 times (a watch replaying it): no step, no
	// change of the bundle.
	before := fresh.rot.Status()
	bundle := fresh.auth.Bundle()
	for range 10000 {
		if err := fresh.rot.Follow(active); err != nil {
			t.Fatal(err)
		}
	}
	if after := fresh.rot.Status(); after.Steps["followed"] != before.Steps["followed"] || !after.NextStepAt.Equal(before.NextStepAt) || fresh.auth.Bundle() != bundle {
		t.Fatalf("a repeated record changed the rotation: steps %v -> %v", before.Steps, after.Steps)
	}
}

// `meshid certs activate` on the leader activates every replica: a
// follower that prepared the same CA signs with it as soon as the leader's
// record says the leader does, long before its own activation time, and
// keeps the old root as retiring; a follower that sees the record before
// the CA itself activates the CA the moment it arrives.
func TestFollowTheLeadersEarlyActivation(t *testing.T) {
	oldR := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	oldCA, newCA := oldR.intermediate(t, "old"), newR.intermediate(t, "new")
	leader, st := persisted(t, oldCA, nil)
	follower, _ := persisted(t, oldCA, nil)
	for _, w := range []*world{leader, follower} {
		if err := w.rot.SetBundle(newCA); err != nil {
			t.Fatal(err)
		}
	}
	if err := follower.rot.Follow(st.last(t, rotation.Prepared)); err != nil {
		t.Fatal(err)
	}
	leader.clk.Set(t0.Add(time.Minute)) // well before the propagation
	if err := leader.rot.Activate(); err != nil {
		t.Fatal(err)
	}
	active := st.last(t, rotation.Active)
	follower.clk.Set(t0.Add(time.Minute + time.Second))
	if err := follower.rot.Follow(active); err != nil {
		t.Fatal(err)
	}
	s := follower.rot.Status()
	if s.Phase != rotation.Active || s.Steps["activated"] != 1 {
		t.Fatalf("follower after the leader's activation: phase %v, steps %v; want active, activated once", s.Phase, s.Steps)
	}
	if follower.auth.Bundle().Cert != newCA.Cert {
		t.Fatal("the follower's authority does not sign with the new CA")
	}
	wantRoots(t, follower, []string{"new root", "old root"})

	// The record before the CA.
	late, _ := persisted(t, oldCA, nil)
	late.clk.Set(t0.Add(2 * time.Minute))
	if err := late.rot.Follow(active); err != nil {
		t.Fatal(err)
	}
	if s := late.rot.Status(); s.Phase == rotation.Active {
		t.Fatal("active before it has the new CA")
	}
	if err := late.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	if s := late.rot.Status(); s.Phase != rotation.Active || late.auth.Bundle().Cert != newCA.Cert {
		t.Fatalf("the CA the leader signs with, offered after its record: phase %v, want active at once", s.Phase)
	}
	wantRoots(t, late, []string{"new root", "old root"})
}

// writerStore refuses to write (rotation.ErrNotWriter) until it becomes
// the writer, like a replica that is not the leader yet.
type writerStore struct {
	writer atomic.Bool
	saved  chan []byte
}

func (s *writerStore) Save(_ context.Context, data []byte) error {
	if !s.writer.Load() {
		return rotation.ErrNotWriter
	}
	s.saved <- data
	return nil
}

// A replica that is not the writer tries again after a while, so that a
// replica elected later writes its state.
func TestNotWriterSavesLater(t *testing.T) {
	r := newRoot(t, "root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	st := &writerStore{saved: make(chan []byte, 1)}
	w := newWorld(t, r.intermediate(t, "ca"), func(c *rotation.Config) { c.Store = st })
	if at := w.parked(t); !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Run waits until %v, want a retry a minute later", at)
	}
	st.writer.Store(true)
	w.clk.Add(time.Minute)
	select {
	case <-st.saved:
	case <-time.After(testkit.Guard):
		t.Fatal("the state was not saved once this replica became the writer")
	}
}
