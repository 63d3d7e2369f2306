package rotation

import (
	"crypto/x509"
	"time"
)

// Phase is where a rotation stands.
type Phase int

// The phases. Retirement ends a rotation: the phase is Stable again.
const (
	Stable   Phase = iota // one CA and its roots; nothing prepared or retiring
	Prepared              // a new CA is prepared: its roots are trusted, the current CA still signs
	Active                // the new CA signs; the old roots are trusted until they retire
)

// Phases lists every phase, in order.
var Phases = []Phase{Stable, Prepared, Active}

func (p Phase) String() string {
	switch p {
	case Prepared:
		return "prepared"
	case Active:
		return "active"
	}
	return "stable"
}

// Root states in a Status.
const (
	RootCurrent  = "current"  // a root of the signing CA
	RootNext     = "next"     // a root of the prepared CA
	RootRetiring = "retiring" // an old root, trusted until RetireAt
)

// Root is one root of the trust bundle.
type Root struct {
	Cert     *x509.Certificate
	State    string    // RootCurrent, RootNext or RootRetiring
	RetireAt time.Time // when a retiring root leaves the bundle; zero otherwise
}

// Status is a snapshot of the rotation, for `meshid inspect --ca`.
type Status struct {
	Phase Phase
	// Since is when the phase started (the start of the process when no
	// step was taken and no saved state restored).
	Since    time.Time
	Signing  *x509.Certificate // the CA certificate that signs leaves now
	Prepared *x509.Certificate // the prepared CA certificate; nil when none
	// ActivateAt is when the prepared CA signs; zero when none.
	ActivateAt time.Time
	Roots      []Root
	// NextStep ("activate", "retire", "rotate-root") is the next timed step,
	// at NextStepAt; "" when none is scheduled.
	NextStep   string
	NextStepAt time.Time
	// Stuck says why the last CA offered was refused or the last step
	// failed; "" when the rotation is not stuck.
	Stuck string
	// Steps counts the steps taken since start, by name (prepared,
	// activated, switched, retired, refused, root_created).
	Steps map[string]int
}

// Status returns where the rotation stands.
func (r *Manager) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.st
	st := Status{Phase: s.phase(), Since: s.since, Signing: s.current.Cert, Stuck: r.stuck, Steps: map[string]int{}}
	for k, v := range r.steps {
		st.Steps[k] = v
	}
	if s.next != nil {
		st.Prepared, st.ActivateAt = s.next.Cert, s.activateAt
	}
	for _, tr := range s.trusted() {
		root := Root{Cert: tr.cert, State: tr.state}
		if tr.state == RootRetiring {
			root.RetireAt = tr.retire.until()
		}
		st.Roots = append(st.Roots, root)
	}
	st.NextStep, st.NextStepAt, _ = r.nextStepLocked()
	return st
}
