package election

import (
	"context"
	"errors"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/internal/logs"
)

// observation is what this Elector knows of the Lease: the last version it
// read or wrote, and when (on its own clock) it first saw that version's
// spec. Expiry is measured from then, never from the renewTime another
// replica wrote with its own clock.
type observation struct {
	lease    *coordinationv1.Lease // nil before the first read or write
	holder   string
	duration time.Duration // the holder's lease duration, as the others honour it
	since    time.Time
}

// expired reports whether the observed holder's term has run out at now.
func (o observation) expired(now time.Time) bool {
	return !now.Before(o.since.Add(o.duration))
}

// observe records l, seen at now. The clock starts again only when the spec
// changed: a Lease whose holder stopped renewing keeps its old time however
// often it is read, and a change to its labels does not extend it.
func (e *Elector) observe(l *coordinationv1.Lease, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev := e.seen
	o := observation{lease: l, holder: holderOf(l), duration: e.durationOf(l), since: now}
	if prev.lease != nil && sameSpec(prev.lease.Spec, l.Spec) {
		o.since = prev.since
	}
	e.seen = o
	if o.holder != prev.holder && o.holder != "" && o.holder != e.cfg.Identity {
		e.log.Info("observed leader", logs.KeyLeader, o.holder)
	}
}

func (e *Elector) observed() observation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seen
}

// try takes the Lease or renews it, in at most timeout (on the wall clock:
// it bounds a hung request). It reports whether this Elector holds the
// Lease, written at a time no earlier than when try was called.
func (e *Elector) try(ctx context.Context, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	now := e.clock.Now()
	// A holder renews the version it wrote last without reading first; a
	// conflict (someone else wrote since) falls through to a fresh read.
	if o := e.observed(); o.lease != nil && o.holder == e.cfg.Identity && !o.expired(now) {
		if e.write(ctx, e.claim(o.lease, now), now) == nil {
			return true
		}
	}
	cur, err := e.leases.Get(ctx, e.cfg.LeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l := e.claim(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.LeaseName}}, now)
		got, err := e.leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			e.log.Debug("creating the Lease failed", logs.KeyError, err)
			return false
		}
		e.observe(got, now)
		return true
	}
	if err != nil {
		e.logFailure(ctx, "reading the Lease failed", err)
		return false
	}
	e.observe(cur, now)
	if o := e.observed(); o.holder != "" && o.holder != e.cfg.Identity && !o.expired(now) {
		return false // held, and not for long enough unchanged
	}
	return e.write(ctx, e.claim(cur, now), now) == nil
}

// write updates the Lease with l, whose resourceVersion is the version it
// was made from, and records the result.
func (e *Elector) write(ctx context.Context, l *coordinationv1.Lease, now time.Time) error {
	got, err := e.leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			e.log.Debug("the Lease changed under this write", logs.KeyError, err)
		} else {
			e.logFailure(ctx, "writing the Lease failed", err)
		}
		return err
	}
	e.observe(got, now)
	return nil
}

// logFailure logs a failed request as a warning, unless it failed because
// Run's context ended (shutdown), which is no news.
func (e *Elector) logFailure(ctx context.Context, msg string, err error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		e.log.Debug(msg, logs.KeyError, err)
		return
	}
	e.log.Warn(msg, logs.KeyError, err)
}

// claim returns a copy of l held by this Elector, renewed at now. Taking it
// from someone else (or from no one) sets acquireTime and counts a
// transition.
func (e *Elector) claim(l *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	l = l.DeepCopy()
	s := &l.Spec
	t := metav1.NewMicroTime(now)
	switch {
	case holderOf(l) != e.cfg.Identity:
		n := nextTransition(s.LeaseTransitions)
		s.LeaseTransitions = &n
		s.AcquireTime = &t
	case s.AcquireTime == nil:
		s.AcquireTime = &t
	}
	id := e.cfg.Identity
	seconds := leaseSeconds(e.cfg.LeaseDuration)
	s.HolderIdentity = &id
	s.LeaseDurationSeconds = &seconds
	s.RenewTime = &t
	return l
}

// release gives the Lease up if this Elector holds it: it clears the holder
// so that the others take it at their next attempt. It is called once Lead
// has returned, with Run's context already ended, so it has its own
// RenewDeadline to finish in. A conflict means the Lease changed; it reads
// it again and releases only if it still holds it.
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	l := e.observed().lease
	for range 3 {
		if l == nil || holderOf(l) != e.cfg.Identity {
			return
		}
		now := e.clock.Now()
		l = l.DeepCopy()
		one := int32(1)
		t := metav1.NewMicroTime(now)
		l.Spec.HolderIdentity = nil
		l.Spec.LeaseDurationSeconds = &one
		l.Spec.RenewTime = &t
		err := e.write(ctx, l, now)
		if err == nil {
			e.log.Info("released the Lease")
			return
		}
		if !apierrors.IsConflict(err) {
			return
		}
		if l, err = e.leases.Get(ctx, e.cfg.LeaseName, metav1.GetOptions{}); err != nil {
			return
		}
		e.observe(l, now)
	}
}

// durationOf is how long the others give l's holder: its
// leaseDurationSeconds, or this Elector's own LeaseDuration when that field
// is missing or not positive (garbage is not taken as "expired at once").
func (e *Elector) durationOf(l *coordinationv1.Lease) time.Duration {
	if s := l.Spec.LeaseDurationSeconds; s != nil && *s > 0 {
		return time.Duration(*s) * time.Second
	}
	return e.cfg.LeaseDuration
}

// leaseSeconds is d in whole seconds, rounded up so the others never wait
// less than d.
func leaseSeconds(d time.Duration) int32 {
	return int32((d + time.Second - 1) / time.Second)
}

// nextTransition counts one more change of holder: 0 for a new Lease (or
// a missing or negative count), and no wrap-around past the int32 range.
func nextTransition(n *int32) int32 {
	switch {
	case n == nil || *n < 0:
		return 0
	case *n == math.MaxInt32:
		return *n
	}
	return *n + 1
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// sameSpec reports whether two versions of the Lease say the same thing,
// comparing times by instant (a decoded time's location may differ).
func sameSpec(a, b coordinationv1.LeaseSpec) bool {
	return eqPtr(a.HolderIdentity, b.HolderIdentity) &&
		eqPtr(a.LeaseDurationSeconds, b.LeaseDurationSeconds) &&
		eqPtr(a.LeaseTransitions, b.LeaseTransitions) &&
		eqTime(a.AcquireTime, b.AcquireTime) &&
		eqTime(a.RenewTime, b.RenewTime)
}

func eqPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func eqTime(a, b *metav1.MicroTime) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Time.Equal(b.Time))
}
