package rotation

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/meshid/meshid/internal/logs"
)

// Steps of Restore and Follow (they move no clock: the phase keeps the
// time it started).
const (
	stepRestored = "restored"
	stepFollowed = "followed"
)

// save hands the newest state to the Store when it changed; a failed save
// is retried after retryDelay.
func (r *Manager) save(ctx context.Context) {
	r.mu.Lock()
	if !r.dirty || r.clock.Now().Before(r.saveRetry) {
		r.mu.Unlock()
		return
	}
	data, err := recordOf(r.st).encode()
	r.dirty = false
	r.mu.Unlock()
	if err == nil {
		err = r.cfg.Store.Save(ctx, data)
	}
	switch {
	case err == nil:
		r.log.Debug("rotation state saved", logs.KeyBytes, len(data))
		return
	case errors.Is(err, ErrNotWriter):
		// Another replica writes; this one tries again later, in case it
		// becomes the writer (a new leader writes its state).
		r.mu.Lock()
		r.dirty, r.saveRetry = true, r.clock.Now().Add(retryDelay)
		r.mu.Unlock()
		return
	}
	if ctx.Err() == nil {
		r.log.Error("the rotation state could not be saved; a restart now would restore the previous one", logs.KeyError, err)
		r.mu.Lock()
		r.dirty, r.saveRetry = true, r.clock.Now().Add(retryDelay)
		r.mu.Unlock()
	}
}

// ErrNotWriter is returned by a Store that does not write on this replica
// (not the leader): the save is tried again after a while, quietly.
var ErrNotWriter = errors.New("rotation: another replica writes the state")

// finalSaveTimeout bounds the save of the last state when Run stops.
const finalSaveTimeout = 5 * time.Second

// finalSave saves a state not saved yet when Run stops (ctx ended), so
// that a restart finds the last step taken.
func (r *Manager) finalSave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalSaveTimeout)
	defer cancel()
	r.mu.Lock()
	r.saveRetry = time.Time{}
	r.mu.Unlock()
	r.save(ctx)
}

// Restore takes up the rotation where a Record saved before a restart left
// it, before Run and before the CA serves. The CA loaded (Config.Current,
// and a CA prepared since New) signs; the record adds what the key
// material alone does not say:
//
//   - every root of the record that the loaded CA does not hold stays in
//     the bundle, retiring at its saved time, or RetireAfter from now for a
//     root that was not retiring yet (its CA may have signed until the
//     restart). A retirement time later than RetireAfter from now is cut
//     to it: no record keeps a root longer than a leaf can live.
//   - the prepared CA keeps its propagation clock when it is the one the
//     record names, so that a restart does not start the clock over.
//
// When the record was saved while a CA was prepared and that CA is the one
// loaded now (the files or Secret already held it), its predecessor's key
// is gone: the prepared CA signs at once, and the log says so.
//
// A record that cannot be vouched for (see parseRecord) is not used at
// all: Restore logs why, the rotation is stuck with that reason, and
// returns an error wrapping ErrRecordRefused. Nothing is dropped because of
// it: the CA loaded, and Config.Retiring, stay as they are.
func (r *Manager) Restore(data []byte) error {
	now := r.clock.Now()
	rec, err := parseRecord(data, now)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.refuseStateLocked(err)
		return err
	}
	ns := r.st.clone()
	loaded := fingerprint(ns.current.Cert)
	resumed := rec.Signing == loaded
	switch {
	case resumed:
		if ns.next != nil && rec.Prepared == fingerprint(ns.next.Cert) {
			ns.preparedAt = rec.PreparedAt
			ns.activateAt = r.sharedActivation(rec, now)
		}
	case rec.Prepared == loaded:
		r.log.Warn("restarted while a CA was prepared: the CA it replaces is no longer loaded, so the prepared CA signs now, before its propagation ended; the old roots stay trusted until retired",
			logs.KeySubject, ns.current.Cert.Subject.String(), logs.KeyActivateAt, rec.ActivateAt)
	default:
		r.log.Warn("the CA changed while the server was down: it signs at once; the roots of the saved state stay trusted until retired",
			logs.KeySubject, ns.current.Cert.Subject.String())
	}
	ns.addRecordRoots(rec, now, r.cfg.RetireAfter, true)
	ns.since = now
	if resumed && ns.phase().String() == rec.Phase {
		ns.since = rec.PhaseSince
	}
	if err := r.commitLocked(ns, stepRestored); err != nil {
		r.stuck = "restoring the saved rotation state: " + err.Error()
		r.changedLocked()
		r.log.Error("the saved rotation state could not be restored", logs.KeyError, err)
		return err
	}
	r.log.Info("rotation state restored", logs.KeyPhase, ns.phase(), logs.KeySince, ns.since, logs.KeyRoots, len(ns.roots()))
	return nil
}

// RefuseState records that the saved state could not even be read (a
// file others may write, say): like a record Restore refuses, it is not
// used, the rotation is stuck with err, and nothing is dropped.
func (r *Manager) RefuseState(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuseStateLocked(err)
}

func (r *Manager) refuseStateLocked(err error) {
	r.stuck = err.Error()
	r.changedLocked()
	r.log.Error("the saved rotation state is refused and not used: roots only it held are not restored", logs.KeyError, err)
	if err := r.startLocked(); err != nil {
		r.log.Error("the roots trusted at start could not be added", logs.KeyError, err)
	}
}

// startLocked hands the Target the roots of Config.Retiring, once: New
// does not touch the Target, so Restore or the start of Run does.
func (r *Manager) startLocked() error {
	if r.started {
		return nil
	}
	r.started = true
	if len(r.cfg.Retiring) == 0 {
		return nil
	}
	return r.commitLocked(r.st, stepRestored)
}

// Follow takes the rotation state another replica saved (the leader's
// record in the cluster) so that every replica keeps one clock: a CA this
// replica prepared too activates at the leader's time, an old root retires
// no earlier than either replica would retire it, and a root the leader
// still trusts is trusted here as well. A record that cannot be vouched for
// is refused with a log, and the replica keeps its own clock.
func (r *Manager) Follow(data []byte) error {
	r.mu.Lock()
	same := r.shared != nil && bytes.Equal(data, r.sharedData)
	r.mu.Unlock()
	if same {
		return nil // a watch replaying the record: taken already
	}
	now := r.clock.Now()
	rec, err := parseRecord(data, now)
	if err != nil {
		r.log.Error("the shared rotation state is refused: this replica keeps its own clock", logs.KeyError, err)
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shared, r.sharedData = rec, bytes.Clone(data)
	ns, changed := r.adoptLocked(r.st, now)
	if !changed {
		return nil
	}
	if ns.current != r.st.current {
		return r.followActivationLocked(ns)
	}
	if len(ns.roots()) != len(r.st.roots()) {
		return r.commitLocked(ns, stepFollowed)
	}
	r.st = ns
	r.changedLocked()
	return nil
}

// followActivationLocked commits ns, in which adoptLocked activated the CA
// the leader signs with, and logs it once the Target took it.
func (r *Manager) followActivationLocked(ns state) error {
	if err := r.commitLocked(ns, "activated"); err != nil {
		return err
	}
	r.log.Info("new CA active: the leader signs with it, so this replica does too",
		logs.KeySubject, ns.current.Cert.Subject.String())
	return nil
}

// adoptLocked applies the last shared record to s. When the leader signs
// with the CA s has prepared, the result signs with it too: the leader
// activated it (at the shared time, or early by `meshid certs activate`),
// and every replica follows at once, so one activation on the leader is
// enough.
func (r *Manager) adoptLocked(s state, now time.Time) (state, bool) {
	rec := r.shared
	if rec == nil {
		return s, false
	}
	ns := s.clone()
	changed := false
	if ns.next != nil && rec.Signing == fingerprint(ns.next.Cert) {
		ns, changed = ns.switchTo(ns.next, now, r.cfg.RetireAfter), true
	}
	if rec.Signing != fingerprint(ns.current.Cert) && rec.Prepared != fingerprint(ns.current.Cert) {
		return s, false // a record of another CA: nothing to share yet
	}
	if ns.next != nil && rec.Signing == fingerprint(ns.current.Cert) && rec.Prepared == fingerprint(ns.next.Cert) {
		if at := r.sharedActivation(rec, now); !at.Equal(ns.activateAt) {
			ns.preparedAt, ns.activateAt, changed = rec.PreparedAt, at, true
		}
	}
	before := slices.Clone(ns.retiring)
	ns.addRecordRoots(rec, now, r.cfg.RetireAfter, false)
	return ns, changed || !slices.EqualFunc(before, ns.retiring, func(a, b retiring) bool {
		return a.cert.Equal(b.cert) && a.at.Equal(b.at)
	})
}

// sharedActivation is the activation time of rec's prepared CA, no later
// than a propagation from now.
func (r *Manager) sharedActivation(rec *record, now time.Time) time.Time {
	if limit := now.Add(r.cfg.Propagation); rec.ActivateAt.After(limit) {
		return limit
	}
	return rec.ActivateAt
}

// addRecordRoots adds rec's roots that s does not hold as retiring (but
// not those of rec's prepared CA, which signed nothing), and
// moves the retirement of those s retires already. A root retires at its
// saved time when it was retiring, else RetireAfter from now; never later
// than RetireAfter from now. On restore the record's time wins (s's is the
// fallback of Config.Retiring); between replicas the later time wins, so
// that no replica drops a root another still needs.
func (s *state) addRecordRoots(rec *record, now time.Time, retireAfter time.Duration, restore bool) {
	limit := now.Add(retireAfter)
	for _, root := range rec.roots {
		if root.state == RootNext {
			continue // a prepared CA's: it signed nothing yet, and arrives by itself
		}
		at := limit
		if root.state == RootRetiring && root.retireAt.Before(limit) {
			at = root.retireAt
		}
		i := slices.IndexFunc(s.retiring, func(o retiring) bool { return o.cert.Equal(root.cert) })
		switch {
		case i >= 0:
			if root.state == RootRetiring && (restore || at.After(s.retiring[i].at)) {
				s.retiring[i].at = at
			}
		case containsCert(s.current.Roots, root.cert), s.next != nil && containsCert(s.next.Roots, root.cert):
		default:
			s.retiring = append(s.retiring, retiring{cert: root.cert, at: at})
		}
	}
}
