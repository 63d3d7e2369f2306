package rotation

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshid/meshid/certs"
)

// Limits of a Record: a record beyond them is refused whole.
const (
	// MaxRecordSize bounds the encoded record (a few roots take a few KiB).
	MaxRecordSize = 64 << 10
	// MaxRecordRoots bounds the roots a record may put in the trust bundle.
	MaxRecordRoots = 16
	// recordVersion is the version this package writes and reads.
	recordVersion = 1
)

// ErrRecordRefused wraps every reason a record is not used.
var ErrRecordRefused = errors.New("rotation: state record refused")

// Record is the rotation's state as kept across restarts and, in
// Kubernetes, shared by the replicas: the roots of the trust bundle (each
// with its state and, for an old root, when it retires), the phase and
// when it started, and the prepared CA's clock. It holds certificates only,
// never a key: the key material stays where the CA is plugged in.
type Record struct {
	Version    int       `json:"version"`
	Phase      string    `json:"phase"`
	PhaseSince time.Time `json:"phase_since"`
	// Signing and Prepared are the SHA-256 (hex) of the signing and the
	// prepared CA certificate ("" when none is prepared).
	Signing    string       `json:"signing"`
	Prepared   string       `json:"prepared,omitempty"`
	PreparedAt time.Time    `json:"prepared_at,omitzero"`
	ActivateAt time.Time    `json:"activate_at,omitzero"`
	Roots      []RecordRoot `json:"roots"`
}

// RecordRoot is one root of a Record.
type RecordRoot struct {
	PEM      string    `json:"pem"`
	State    string    `json:"state"` // RootCurrent, RootNext or RootRetiring
	RetireAt time.Time `json:"retire_at,omitzero"`
}

// record is a parsed and checked Record.
type record struct {
	Record
	roots []recordRoot
}

type recordRoot struct {
	cert     *x509.Certificate
	state    string
	retireAt time.Time
}

// fingerprint names a certificate in a Record.
func fingerprint(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// recordOf is s as a Record.
func recordOf(s state) Record {
	rec := Record{
		Version: recordVersion, Phase: s.phase().String(), PhaseSince: s.since,
		Signing: fingerprint(s.current.Cert), Roots: []RecordRoot{},
	}
	if s.next != nil {
		rec.Prepared, rec.PreparedAt, rec.ActivateAt = fingerprint(s.next.Cert), s.preparedAt, s.activateAt
	}
	for _, tr := range s.trusted() {
		rec.Roots = append(rec.Roots, RecordRoot{PEM: string(certs.EncodeCertificates(tr.cert)), State: tr.state, RetireAt: tr.retire.at})
	}
	return rec
}

// encode is rec in its stored form.
func (rec Record) encode() ([]byte, error) {
	return json.MarshalIndent(rec, "", "  ")
}

// parseRecord decodes and checks a stored record at now. It refuses (with
// ErrRecordRefused and the reason) anything it cannot vouch for: a record
// too large, not JSON, of another version or with unknown fields, with too
// many roots, a root that does not parse or is not a CA certificate, an
// unknown state or phase, an old root without a retirement time. An expired
// root is left out (it can anchor no leaf, and would make the bundle
// invalid).
func parseRecord(data []byte, now time.Time) (*record, error) {
	refuse := func(format string, args ...any) (*record, error) {
		return nil, fmt.Errorf("%w: %s", ErrRecordRefused, fmt.Sprintf(format, args...))
	}
	if len(data) > MaxRecordSize {
		return refuse("%d bytes, more than the %d allowed", len(data), MaxRecordSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var rec Record
	if err := dec.Decode(&rec); err != nil {
		return refuse("not a rotation record: %v", err)
	}
	if dec.More() {
		return refuse("trailing data after the record")
	}
	if rec.Version != recordVersion {
		return refuse("version %d, want %d", rec.Version, recordVersion)
	}
	if rec.Phase != Stable.String() && rec.Phase != Prepared.String() && rec.Phase != Active.String() {
		return refuse("unknown phase %q", rec.Phase)
	}
	if (rec.Prepared != "") != (rec.Phase == Prepared.String()) {
		return refuse("phase %q does not match the prepared CA %q", rec.Phase, rec.Prepared)
	}
	if len(rec.Roots) == 0 || len(rec.Roots) > MaxRecordRoots {
		return refuse("%d roots, want 1 to %d", len(rec.Roots), MaxRecordRoots)
	}
	out := &record{Record: rec}
	for i, r := range rec.Roots {
		cs, err := certs.ParseCertificates([]byte(r.PEM))
		if err != nil || len(cs) != 1 {
			return refuse("root %d: not one PEM certificate (%v)", i, err)
		}
		c := cs[0]
		if !c.BasicConstraintsValid || !c.IsCA {
			return refuse("root %d (%q): not a CA certificate", i, c.Subject.String())
		}
		switch r.State {
		case RootCurrent, RootNext:
		case RootRetiring:
			if r.RetireAt.IsZero() {
				return refuse("root %d (%q): retiring without a retirement time", i, c.Subject.String())
			}
		default:
			return refuse("root %d: unknown state %q", i, r.State)
		}
		if now.After(c.NotAfter) {
			continue
		}
		out.roots = append(out.roots, recordRoot{cert: c, state: r.State, retireAt: r.RetireAt})
	}
	return out, nil
}
