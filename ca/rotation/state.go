package rotation

import (
	"crypto/x509"
	"slices"
	"time"

	"github.com/meshid/meshid/ca/keystore"
)

// state is one consistent view of a rotation. Transitions build a new
// state and commit it only once the Target accepted its bundle, so a
// refused step leaves the previous state whole.
type state struct {
	current    *keystore.Bundle // signs
	next       *keystore.Bundle // prepared; nil when none
	preparedAt time.Time
	activateAt time.Time
	retiring   []retiring // old roots still trusted for the leaves they signed
	since      time.Time  // when the phase started; zero before the first step
}

// retiring is an old root and when it leaves the bundle.
type retiring struct {
	cert *x509.Certificate
	at   time.Time
}

// until is when the root leaves the bundle: at its retirement, or at its
// own expiry if that comes first (an expired root would make the bundle
// invalid).
func (o retiring) until() time.Time {
	if o.cert.NotAfter.Before(o.at) {
		return o.cert.NotAfter
	}
	return o.at
}

func (s state) clone() state {
	s.retiring = slices.Clone(s.retiring)
	return s
}

// phase derives the phase from what the state holds.
func (s state) phase() Phase {
	switch {
	case s.next != nil:
		return Prepared
	case len(s.retiring) > 0:
		return Active
	}
	return Stable
}

// settled are the roots every consumer has had for a while: the signing
// CA's and the retiring ones, not those of a CA still propagating.
func (s state) settled() []*x509.Certificate {
	out := slices.Clone(s.current.Roots)
	for _, o := range s.retiring {
		out = appendNew(out, o.cert)
	}
	return out
}

// roots is the trust bundle: the current CA's roots, then the prepared
// CA's, then the retiring ones, each once.
func (s state) roots() []*x509.Certificate {
	out := slices.Clone(s.current.Roots)
	if s.next != nil {
		for _, c := range s.next.Roots {
			out = appendNew(out, c)
		}
	}
	for _, o := range s.retiring {
		out = appendNew(out, o.cert)
	}
	return out
}

// trustedRoot is a root of the trust bundle with its state (RootCurrent,
// RootNext, RootRetiring) and, for an old root, its retirement.
type trustedRoot struct {
	cert   *x509.Certificate
	state  string
	retire retiring
}

// trusted lists the trust bundle's roots (in the order of roots) with
// their states.
func (s state) trusted() []trustedRoot {
	var out []trustedRoot
	for _, c := range s.roots() {
		tr := trustedRoot{cert: c, state: RootCurrent}
		switch {
		case containsCert(s.current.Roots, c):
		case s.next != nil && containsCert(s.next.Roots, c):
			tr.state = RootNext
		default:
			tr.state = RootRetiring
			for _, o := range s.retiring {
				if o.cert.Equal(c) {
					tr.retire = o
				}
			}
		}
		out = append(out, tr)
	}
	return out
}

// bundle is what the Target signs with: the current CA, trusting roots.
func (s state) bundle() *keystore.Bundle {
	return &keystore.Bundle{
		Cert:          s.current.Cert,
		Key:           s.current.Key,
		Intermediates: s.current.Intermediates,
		Roots:         s.roots(),
	}
}

// switchTo makes b sign from now on. The roots of the CA it replaces that b
// does not keep stay trusted until now+retireAfter; a retiring root that b
// brings back is no longer retiring. A prepared CA is dropped (or, when b
// is that CA, activated).
func (s state) switchTo(b *keystore.Bundle, now time.Time, retireAfter time.Duration) state {
	ns := state{current: b, since: now}
	for _, o := range s.retiring {
		if !containsCert(b.Roots, o.cert) {
			ns.retiring = append(ns.retiring, o)
		}
	}
	for _, c := range s.current.Roots {
		if !containsCert(b.Roots, c) && !ns.isRetiring(c) {
			ns.retiring = append(ns.retiring, retiring{cert: c, at: now.Add(retireAfter)})
		}
	}
	return ns
}

func (s state) isRetiring(c *x509.Certificate) bool {
	for _, o := range s.retiring {
		if o.cert.Equal(c) {
			return true
		}
	}
	return false
}

// retire drops the retiring roots that are due at now.
func (s state) retire(now time.Time) (state, []*x509.Certificate) {
	var dropped []*x509.Certificate
	ns := s.clone()
	ns.retiring = ns.retiring[:0]
	for _, o := range s.retiring {
		if now.Before(o.until()) {
			ns.retiring = append(ns.retiring, o)
		} else {
			dropped = append(dropped, o.cert)
		}
	}
	if len(dropped) > 0 && ns.phase() != s.phase() {
		ns.since = now
	}
	return ns, dropped
}

func appendNew(list []*x509.Certificate, c *x509.Certificate) []*x509.Certificate {
	if containsCert(list, c) {
		return list
	}
	return append(list, c)
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	return slices.ContainsFunc(list, c.Equal)
}

// subset reports whether every certificate of a is in b.
func subset(a, b []*x509.Certificate) bool {
	for _, c := range a {
		if !containsCert(b, c) {
			return false
		}
	}
	return true
}

// sameBundle reports whether a and b hold the same certificates.
func sameBundle(a, b *keystore.Bundle) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cert.Equal(b.Cert) && slices.EqualFunc(a.Intermediates, b.Intermediates, (*x509.Certificate).Equal) &&
		slices.EqualFunc(a.Roots, b.Roots, (*x509.Certificate).Equal)
}
