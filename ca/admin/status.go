package admin

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/ca/upstream"
)

// Status is the JSON form of a rotation.Status (schema stable: fields are
// only ever added).
type Status struct {
	Phase      string         `json:"phase"`
	Since      *time.Time     `json:"since"`
	Signing    *Cert          `json:"signing"`
	Prepared   *Cert          `json:"prepared"`
	ActivateAt *time.Time     `json:"activate_at"`
	Roots      []Root         `json:"roots"`
	NextStep   string         `json:"next_step"`
	NextStepAt *time.Time     `json:"next_step_at"`
	Stuck      string         `json:"stuck"`
	Steps      map[string]int `json:"steps"`
	// Federation is each federated trust domain's bundle state (absent
	// without --federate-with).
	Federation []spiffefed.PeerStatus `json:"federation,omitempty"`
	// Upstream is the upstream CA's renewal of the intermediate (absent
	// without --upstream).
	Upstream *upstream.Status `json:"upstream,omitempty"`
}

// Cert names a certificate.
type Cert struct {
	Subject   string    `json:"subject"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
}

// Root is a root of the trust bundle.
type Root struct {
	Cert
	State    string     `json:"state"`
	RetireAt *time.Time `json:"retire_at"`
}

func certOf(c *x509.Certificate) *Cert {
	if c == nil {
		return nil
	}
	return &Cert{Subject: c.Subject.String(), Serial: c.SerialNumber.Text(16), NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC()}
}

func timeOf(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// StatusOf converts a rotation.Status.
func StatusOf(st rotation.Status) Status {
	out := Status{
		Phase:      st.Phase.String(),
		Since:      timeOf(st.Since),
		Signing:    certOf(st.Signing),
		Prepared:   certOf(st.Prepared),
		ActivateAt: timeOf(st.ActivateAt),
		NextStep:   st.NextStep,
		NextStepAt: timeOf(st.NextStepAt),
		Stuck:      st.Stuck,
		Steps:      st.Steps,
		Roots:      []Root{},
	}
	for _, r := range st.Roots {
		out.Roots = append(out.Roots, Root{Cert: *certOf(r.Cert), State: r.State, RetireAt: timeOf(r.RetireAt)})
	}
	return out
}

// Print writes st as indented JSON, or else for a person (Format): what
// `meshid certs status` and `meshid inspect --ca` print.
func (st Status) Print(w io.Writer, now time.Time, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	st.Format(w, now)
	return nil
}

// Format writes st for a person, with times relative to now.
func (st Status) Format(w io.Writer, now time.Time) {
	in := func(t time.Time) string {
		return fmt.Sprintf("%s (%s)", t.Format(time.RFC3339), relative(t.Sub(now)))
	}
	if st.Since != nil {
		fmt.Fprintf(w, "phase:     %s  since %s\n", st.Phase, in(*st.Since))
	} else {
		fmt.Fprintf(w, "phase:     %s\n", st.Phase)
	}
	if st.Signing != nil {
		fmt.Fprintf(w, "signing:   %s  serial %s  expires %s\n", st.Signing.Subject, st.Signing.Serial, in(st.Signing.NotAfter))
	}
	if st.Prepared != nil && st.ActivateAt != nil {
		fmt.Fprintf(w, "prepared:  %s  serial %s  activates %s\n", st.Prepared.Subject, st.Prepared.Serial, in(*st.ActivateAt))
	}
	if st.NextStep != "" && st.NextStepAt != nil {
		fmt.Fprintf(w, "next step: %s %s\n", st.NextStep, in(*st.NextStepAt))
	} else {
		fmt.Fprintln(w, "next step: none scheduled")
	}
	if st.Stuck != "" {
		fmt.Fprintf(w, "STUCK:     %s\n", st.Stuck)
	}
	fmt.Fprintf(w, "bundle:    %d root(s)\n", len(st.Roots))
	for _, r := range st.Roots {
		line := fmt.Sprintf("  %-9s %s  serial %s  expires %s", r.State, r.Subject, r.Serial, in(r.NotAfter))
		if r.RetireAt != nil {
			line += "  retires " + in(*r.RetireAt)
		}
		fmt.Fprintln(w, line)
	}
	st.formatFederation(w, in)
	st.formatUpstream(w, in)
}

// formatUpstream writes the upstream CA, its intermediate's expiry, the
// next renewal, and the last error while mints fail.
func (st Status) formatUpstream(w io.Writer, in func(time.Time) string) {
	u := st.Upstream
	if u == nil {
		return
	}
	fmt.Fprintf(w, "upstream:  %s\n", u.Upstream)
	fmt.Fprintf(w, "  intermediate %s  serial %s  expires %s\n", u.Subject, u.Serial, in(u.NotAfter))
	fmt.Fprintf(w, "  renewal      %s\n", in(u.RenewAt))
	if u.Failures > 0 {
		fmt.Fprintf(w, "  FAILING: %d attempt(s), last %s, next %s: %s\n", u.Failures, in(u.LastFailure), in(u.RetryAt), u.LastError)
	}
}

// formatFederation writes each federated trust domain: endpoint, last
// refresh, sequence, roots' expiry, and the last error while failing.
func (st Status) formatFederation(w io.Writer, in func(time.Time) string) {
	if len(st.Federation) == 0 {
		return
	}
	fmt.Fprintf(w, "federation: %d trust domain(s)\n", len(st.Federation))
	for _, f := range st.Federation {
		last := "never"
		if !f.LastSuccess.IsZero() {
			last = in(f.LastSuccess)
		}
		fmt.Fprintf(w, "  %s  %s (%s)  refreshed %s  sequence %d  %d root(s)", f.TrustDomain, f.URL, f.Profile, last, f.Sequence, f.X509Roots)
		if !f.RootsExpiry.IsZero() {
			fmt.Fprintf(w, " expiring %s", in(f.RootsExpiry))
		}
		fmt.Fprintln(w)
		if f.LastError != "" {
			fmt.Fprintf(w, "    FAILING since %s: %s\n", in(f.LastFailure), f.LastError)
		}
	}
}

// relative says d as "in 9m0s" or "3m0s ago".
func relative(d time.Duration) string {
	d = d.Round(time.Second)
	if d < 0 {
		return (-d).String() + " ago"
	}
	return "in " + d.String()
}
