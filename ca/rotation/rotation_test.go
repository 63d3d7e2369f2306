package rotation_test

import (
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/testkit"
)

// A plugged CA replaced by one under a new root passes prepared, active
// and retired on the clock: the bundle holds both roots before the new CA
// signs, and drops the old root RetireAfter after the activation.
func TestRootRotationPhases(t *testing.T) {
	oldRoot := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	oldCA := oldRoot.intermediate(t, "old intermediate")
	w := newWorld(t, oldCA, nil)
	if st := w.rot.Status(); st.Phase != rotation.Stable || st.NextStep != "" {
		t.Fatalf("start: %v, next step %q", st.Phase, st.NextStep)
	}

	newCA := newR.intermediate(t, "new intermediate")
	if err := w.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	st := w.rot.Status()
	if st.Phase != rotation.Prepared || st.NextStep != "activate" || !st.NextStepAt.Equal(t0.Add(propagation)) {
		t.Fatalf("prepared: %v, next %q at %v", st.Phase, st.NextStep, st.NextStepAt)
	}
	if got := subjects(w.auth.Bundle().Roots); !slices.Equal(got, []string{"old root", "new root"}) {
		t.Fatalf("prepared bundle roots %q, want the union", got)
	}
	iss := w.leaf(t)
	if !issuedBy(iss, oldCA.Cert) || len(iss.Roots) != 2 {
		t.Fatalf("prepared: leaf not signed by the old CA, or %d roots in the answer", len(iss.Roots))
	}
	if m := testkit.Metric(t, w.reg, "meshid_ca_rotation_phase", "phase", "prepared"); m != 1 {
		t.Fatalf("meshid_ca_rotation_phase{prepared} = %v", m)
	}
	// Offering the same CA again (the watcher reloading) changes nothing.
	if err := w.rot.SetBundle(newCA); err != nil || w.rot.Status().ActivateAt != t0.Add(propagation) {
		t.Fatalf("re-offer: %v, activate at %v", err, w.rot.Status().ActivateAt)
	}

	// One second before the propagation ends, the old CA still signs.
	if at := w.parked(t); !at.Equal(t0.Add(propagation)) {
		t.Fatalf("Run waits until %v, want %v", at, t0.Add(propagation))
	}
	w.clk.Set(t0.Add(propagation - time.Second))
	if !issuedBy(w.leaf(t), oldCA.Cert) {
		t.Fatal("the new CA signed before the propagation ended")
	}
	w.clk.Set(t0.Add(propagation))
	st = w.waitPhase(t, rotation.Active)
	activated := t0.Add(propagation)
	if st.NextStep != "retire" || !st.NextStepAt.Equal(activated.Add(retireAfter)) {
		t.Fatalf("active: next %q at %v, want retire at %v", st.NextStep, st.NextStepAt, activated.Add(retireAfter))
	}
	iss = w.leaf(t)
	if !issuedBy(iss, newCA.Cert) || len(iss.Roots) != 2 {
		t.Fatalf("active: leaf not signed by the new CA, or %d roots", len(iss.Roots))
	}
	if st.Roots[1].State != rotation.RootRetiring || st.Roots[0].State != rotation.RootCurrent || st.Roots[1].Cert.Subject.CommonName != "old root" {
		t.Fatalf("active roots: %+v", st.Roots)
	}

	w.parked(t)
	w.clk.Set(activated.Add(retireAfter - time.Second))
	if w.rot.Status().Phase != rotation.Active {
		t.Fatal("retired early")
	}
	w.clk.Set(activated.Add(retireAfter))
	st = w.waitPhase(t, rotation.Stable)
	if got := subjects(w.auth.Bundle().Roots); !slices.Equal(got, []string{"new root"}) {
		t.Fatalf("retired bundle roots %q, want only the new root", got)
	}
	if st.Steps["prepared"] != 1 || st.Steps["activated"] != 1 || st.Steps["retired"] != 1 {
		t.Fatalf("steps %v", st.Steps)
	}
	if m := testkit.Metric(t, w.reg, "meshid_ca_bundle_root_expiry_timestamp_seconds", "subject", "CN=new root", "state", "current"); m != float64(newR.cert.NotAfter.Unix()) {
		t.Fatalf("root expiry metric %v", m)
	}
}

// Activate switches at once; a second Activate has nothing to do.
func TestActivateEarly(t *testing.T) {
	oldRoot := newRoot(t, "old root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	w := newWorld(t, oldRoot.intermediate(t, "old intermediate"), nil)
	if err := w.rot.Activate(); !errors.Is(err, rotation.ErrNothingPrepared) {
		t.Fatalf("Activate with nothing prepared: %v", err)
	}
	newCA := newR.intermediate(t, "new intermediate")
	if err := w.rot.SetBundle(newCA); err != nil {
		t.Fatal(err)
	}
	w.clk.Add(time.Minute)
	if err := w.rot.Activate(); err != nil {
		t.Fatal(err)
	}
	st := w.rot.Status()
	if st.Phase != rotation.Active || !issuedBy(w.leaf(t), newCA.Cert) || !st.NextStepAt.Equal(t0.Add(time.Minute+retireAfter)) {
		t.Fatalf("after Activate: %v, retire at %v", st.Phase, st.NextStepAt)
	}
	if err := w.rot.Activate(); !errors.Is(err, rotation.ErrNothingPrepared) {
		t.Fatalf("second Activate: %v", err)
	}
}

// An intermediate rotated under the same root needs no propagation: the
// bundle does not change and new leaves chain through it at once.
func TestIntermediateOnly(t *testing.T) {
	r := newRoot(t, "root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	w := newWorld(t, r.intermediate(t, "first"), nil)
	second := r.intermediate(t, "second")
	if err := w.rot.SetBundle(second); err != nil {
		t.Fatal(err)
	}
	st := w.rot.Status()
	if st.Phase != rotation.Stable || st.NextStep != "" || st.Steps["switched"] != 1 {
		t.Fatalf("intermediate rotation: %v next %q steps %v", st.Phase, st.NextStep, st.Steps)
	}
	iss := w.leaf(t)
	if !issuedBy(iss, second.Cert) || !iss.Chain[0].Equal(second.Cert) || len(iss.Roots) != 1 || !iss.Roots[0].Equal(r.cert) {
		t.Fatalf("leaf does not chain through the new intermediate to the same root: chain %q roots %q", subjects(iss.Chain), subjects(iss.Roots))
	}
}

// A new CA that does not validate is refused: the old one keeps signing,
// nothing is prepared, and the rotation is stuck until a valid CA comes.
func TestInvalidCARefused(t *testing.T) {
	r := newRoot(t, "root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	other := newRoot(t, "other root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	oldCA := r.intermediate(t, "old intermediate")
	w := newWorld(t, oldCA, nil)

	mismatch := other.intermediate(t, "mismatch")
	mismatch.Key = testkit.Key(t, "ec-p256")
	expiredRoot := newRoot(t, "expired root", t0.Add(-48*time.Hour), 24*time.Hour)
	broken := other.intermediate(t, "broken")
	broken.Roots = []*x509.Certificate{r.cert} // signed under "other root", trusts only "root"
	cases := map[string]struct {
		b    *keystore.Bundle
		want string
	}{
		"key mismatch": {mismatch, "does not match"},
		"expired":      {&keystore.Bundle{Cert: expiredRoot.cert, Key: expiredRoot.key, Roots: []*x509.Certificate{expiredRoot.cert}}, "expired"},
		"not a CA":     {other.notCA(t), "not a CA"},
		"chain broken": {broken, "does not chain"},
	}
	for name, c := range cases {
		err := w.rot.SetBundle(c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want an error containing %q", name, err, c.want)
		}
		st := w.rot.Status()
		if st.Phase != rotation.Stable || !st.Signing.Equal(oldCA.Cert) || st.Stuck == "" {
			t.Fatalf("%s: phase %v, stuck %q", name, st.Phase, st.Stuck)
		}
		if m := testkit.Metric(t, w.reg, "meshid_ca_rotation_stuck"); m != 1 {
			t.Fatalf("%s: meshid_ca_rotation_stuck = %v", name, m)
		}
		if !issuedBy(w.leaf(t), oldCA.Cert) || len(w.auth.Bundle().Roots) != 1 {
			t.Fatalf("%s: the old CA stopped signing or the bundle changed", name)
		}
	}
	if err := w.rot.SetBundle(other.intermediate(t, "good")); err != nil {
		t.Fatal(err)
	}
	if st := w.rot.Status(); st.Stuck != "" || st.Phase != rotation.Prepared {
		t.Fatalf("a valid CA after refusals: %v, stuck %q", st.Phase, st.Stuck)
	}
	if m := testkit.Metric(t, w.reg, "meshid_ca_rotation_stuck"); m != 0 {
		t.Fatalf("meshid_ca_rotation_stuck = %v after a valid CA", m)
	}
}

// A prepared CA that expires before its activation is not activated: the
// old CA keeps signing, the rotation is stuck and retried.
func TestActivationFailsStuck(t *testing.T) {
	r := newRoot(t, "root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	shortRoot := newRoot(t, "short root", t0.Add(-time.Hour), time.Hour+propagation/2)
	oldCA := r.intermediate(t, "old intermediate")
	w := newWorld(t, oldCA, nil)
	short := &keystore.Bundle{Cert: shortRoot.cert, Key: shortRoot.key, Roots: []*x509.Certificate{shortRoot.cert}}
	if err := w.rot.SetBundle(short); err != nil {
		t.Fatal(err)
	}
	w.parked(t)
	w.clk.Set(t0.Add(propagation))
	w.waitFor(t, "an expired prepared CA makes the rotation stuck", func(st rotation.Status) bool { return st.Stuck != "" })
	st := w.rot.Status()
	if st.Phase != rotation.Prepared || !st.Signing.Equal(oldCA.Cert) || !issuedBy(w.leaf(t), oldCA.Cert) {
		t.Fatalf("after a failed activation: %v, signing %q", st.Phase, st.Signing.Subject)
	}
	if m := testkit.Metric(t, w.reg, "meshid_ca_rotation_stuck"); m != 1 {
		t.Fatalf("meshid_ca_rotation_stuck = %v", m)
	}
	if at := w.parked(t); !at.Equal(t0.Add(propagation + time.Minute)) {
		t.Fatalf("retry at %v, want a minute later", at)
	}
}

// A retiring root leaves the bundle at its own expiry when that comes
// before RetireAfter: an expired root would make the bundle invalid.
func TestRetiringRootLeavesAtItsExpiry(t *testing.T) {
	oldRoot := newRoot(t, "old root", t0.Add(-time.Hour), time.Hour+propagation+retireAfter/2)
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	w := newWorld(t, &keystore.Bundle{Cert: oldRoot.cert, Key: oldRoot.key, Roots: []*x509.Certificate{oldRoot.cert}}, nil)
	if err := w.rot.SetBundle(newR.intermediate(t, "new")); err != nil {
		t.Fatal(err)
	}
	if err := w.rot.Activate(); err != nil {
		t.Fatal(err)
	}
	if st := w.rot.Status(); !st.NextStepAt.Equal(oldRoot.cert.NotAfter) {
		t.Fatalf("retire at %v, want the old root's expiry %v", st.NextStepAt, oldRoot.cert.NotAfter)
	}
	w.parked(t)
	w.clk.Set(oldRoot.cert.NotAfter)
	w.waitPhase(t, rotation.Stable)
	if got := subjects(w.auth.Bundle().Roots); !slices.Equal(got, []string{"new root"}) {
		t.Fatalf("roots %q", got)
	}
}

// A self-signed root is replaced when less than the threshold is left:
// the new root is prepared by itself and activated after propagation.
// RotateRoot refuses while one is prepared, and for a plugged CA.
func TestSelfSignedRootNearExpiry(t *testing.T) {
	const threshold = 30 * 24 * time.Hour
	first := newRoot(t, "first root", t0.Add(-time.Hour), 40*24*time.Hour)
	made := 0
	w := newWorld(t, &keystore.Bundle{Cert: first.cert, Key: first.key, Roots: []*x509.Certificate{first.cert}}, func(c *rotation.Config) {
		c.RootRotationThreshold = threshold
		c.NewRoot = func() (*keystore.Bundle, error) {
			made++
			b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), Clock: c.Clock})
			return b, err
		}
	})
	due := first.cert.NotAfter.Add(-threshold)
	if st := w.rot.Status(); st.NextStep != "rotate-root" || !st.NextStepAt.Equal(due) {
		t.Fatalf("next %q at %v, want rotate-root at %v", st.NextStep, st.NextStepAt, due)
	}
	if at := w.parked(t); !at.Equal(due) {
		t.Fatalf("Run waits until %v, want %v", at, due)
	}
	w.clk.Set(due)
	st := w.waitPhase(t, rotation.Prepared)
	if made != 1 || st.Steps["root_created"] != 1 || len(w.auth.Bundle().Roots) != 2 || !st.Signing.Equal(first.cert) {
		t.Fatalf("made %d roots, steps %v, %d roots in the bundle", made, st.Steps, len(w.auth.Bundle().Roots))
	}
	if err := w.rot.RotateRoot(); !errors.Is(err, rotation.ErrAlreadyPrepared) {
		t.Fatalf("RotateRoot while prepared: %v", err)
	}
	if err := w.rot.Activate(); err != nil {
		t.Fatal(err)
	}
	if err := w.rot.RotateRoot(); err != nil { // a second rotation may start at once
		t.Fatal(err)
	}
	if made != 2 {
		t.Fatalf("made %d roots", made)
	}

	plugged := newWorld(t, first.intermediate(t, "plugged"), nil)
	if err := plugged.rot.RotateRoot(); !errors.Is(err, rotation.ErrPlugged) {
		t.Fatalf("RotateRoot of a plugged CA: %v", err)
	}
}

// A CA directory that cannot be loaded (a half-written set: the new
// certificate without its key) is refused with the file named, and the
// rotation is stuck until the directory is whole again.
func TestDirWatcherRefusalNamesFile(t *testing.T) {
	r := newRoot(t, "root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	oldCA := r.intermediate(t, "old")
	w := newWorld(t, oldCA, nil)
	dir := t.TempDir()
	newR := newRoot(t, "new root", t0.Add(-time.Hour), 10*365*24*time.Hour)
	next := newR.intermediate(t, "new")
	writeCADir(t, dir, next)
	// Half written: the old key next to the new certificate.
	writeKey(t, dir, oldCA.Key)
	dw, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: dir, Target: w.rot, Clock: w.clk})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "dirwatcher", dw.Run)
	w.waitFor(t, "a half-written directory makes the rotation stuck", func(st rotation.Status) bool { return st.Stuck != "" })
	if st := w.rot.Status(); !strings.Contains(st.Stuck, "ca-key.pem") || st.Phase != rotation.Stable {
		t.Fatalf("stuck %q (want the file named), phase %v", st.Stuck, st.Phase)
	}
	writeKey(t, dir, next.Key)
	w.parked(t) // the watcher's reload delay (Run has no step to wait for)
	w.clk.Add(keystore.DefaultDirReloadDelay)
	w.waitPhase(t, rotation.Prepared)
	if st := w.rot.Status(); st.Stuck != "" || !st.Prepared.Equal(next.Cert) {
		t.Fatalf("after the key arrived: stuck %q", st.Stuck)
	}
}
