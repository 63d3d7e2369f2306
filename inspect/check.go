package inspect

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
)

// SchemaVersion is the version of the JSON report shape. It changes only
// if a field has to change meaning; new fields do not change it.
const SchemaVersion = 1

// Code names a kind of problem. The codes are part of the JSON contract.
type Code string

// Problem codes.
const (
	CodeExpired       Code = "expired"        // a certificate's NotAfter has passed
	CodeNotYetValid   Code = "not_yet_valid"  // a certificate's NotBefore is in the future
	CodeUnknownIssuer Code = "unknown_issuer" // the chain does not lead to a trusted root
	CodeNameMismatch  Code = "name_mismatch"  // issuer/subject names, trust domain or name constraints disagree
	CodeKeyMismatch   Code = "key_mismatch"   // the private key does not belong to the certificate or CSR
	CodeNotSPIFFE     Code = "not_spiffe"     // the leaf is not a SPIFFE X509-SVID
	CodeInvalid       Code = "invalid"        // anything else that makes it unusable (not a CA, bad signature, path length)
	CodeExpiring      Code = "expiring"       // valid, but expires within Options.ExpiresWithin
)

// Problem is one reason an input is not (or soon not) valid.
type Problem struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// Status summarises a report.
type Status string

// Report statuses.
const (
	StatusOK       Status = "ok"       // everything valid
	StatusExpiring Status = "expiring" // valid, but something expires within the window
	StatusInvalid  Status = "invalid"  // something is invalid or expired
)

// Options control Check.
type Options struct {
	// Now is the time to check validity at. Callers pass their clock's Now.
	Now time.Time
	// Roots, when set, are the trusted roots for every input (--roots).
	Roots     []*x509.Certificate
	RootsName string
	// ExpiresWithin flags certificates that expire sooner than this.
	ExpiresWithin time.Duration
	// TrustDomain, when set, is the trust domain every leaf must be in.
	TrustDomain spiffeid.TrustDomain
	// AllowDNS accepts a leaf named by DNS SANs and no URI SAN (an
	// ingress gateway's certificate) instead of calling it not SPIFFE; its
	// chain is still verified (--allow-dns).
	AllowDNS bool
}

// Report is the outcome of Check; it is what `-o json` prints.
type Report struct {
	SchemaVersion int       `json:"schema_version"`
	Time          time.Time `json:"time"`
	Status        Status    `json:"status"`
	Valid         bool      `json:"valid"`
	ExpiresWithin string    `json:"expires_within,omitempty"`
	Results       []Result  `json:"results"`
	// JWTBundles are the keys of the JWT bundles read (--workload-api).
	JWTBundles []JWTKey `json:"jwt_bundles,omitempty"`
}

// Result is one row: an input, its verdict and its details.
type Result struct {
	Name             string        `json:"name"`
	Origin           Origin        `json:"origin"`
	Type             Type          `json:"type"`
	Valid            bool          `json:"valid"`
	SPIFFEID         string        `json:"spiffe_id"`
	Serial           string        `json:"serial"`
	NotBefore        *time.Time    `json:"not_before"`
	NotAfter         *time.Time    `json:"not_after"`
	ExpiresIn        string        `json:"expires_in"`
	ExpiresInSeconds *int64        `json:"expires_in_seconds"`
	VerifiedAgainst  string        `json:"verified_against"`
	Problems         []Problem     `json:"problems"`
	Certificates     []Certificate `json:"certificates"`
	PrivateKey       *PrivateKey   `json:"private_key"`
	CSR              *CSR          `json:"csr"`
}

// Check inspects every input at opts.Now and returns the report.
func Check(inputs []*Input, opts Options) *Report {
	rep := &Report{SchemaVersion: SchemaVersion, Time: opts.Now.UTC(), Results: []Result{}}
	if opts.ExpiresWithin > 0 {
		rep.ExpiresWithin = shortDuration(opts.ExpiresWithin)
	}
	for _, in := range inputs {
		rep.Results = append(rep.Results, checkInput(in, inputs, opts))
	}
	rep.Status = StatusOK
	for _, r := range rep.Results {
		if !r.Valid {
			rep.Status = StatusInvalid
			break
		}
		for _, p := range r.Problems {
			if p.Code == CodeExpiring {
				rep.Status = StatusExpiring
			}
		}
	}
	rep.Valid = rep.Status != StatusInvalid
	return rep
}

func checkInput(in *Input, all []*Input, opts Options) Result {
	r := Result{
		Name:         displayName(in.Name), // "stdin" for "-", in JSON as in the table
		Origin:       in.Origin,
		Type:         in.Type(),
		Problems:     []Problem{},
		Certificates: []Certificate{},
	}
	add := func(ps ...Problem) { r.Problems = append(r.Problems, ps...) }
	for _, c := range in.Certs {
		r.Certificates = append(r.Certificates, DescribeCertificate(c, opts.Now))
	}
	if len(in.Certs) != 0 {
		first := r.Certificates[0]
		r.SPIFFEID, r.Serial = first.SPIFFEID, first.Serial
		r.NotBefore, r.NotAfter = &first.NotBefore, &first.NotAfter
		r.ExpiresIn, r.ExpiresInSeconds = first.ExpiresIn, &first.ExpiresInSeconds
	}

	roots, rootsName := in.Roots, in.RootsName
	if len(opts.Roots) != 0 {
		roots, rootsName = opts.Roots, opts.RootsName
	}

	switch {
	case in.CSR != nil:
		d := DescribeCSR(in.CSR)
		r.CSR = &d
		r.SPIFFEID = d.SPIFFEID
		add(csrProblems(in.CSR, d)...)
		if in.Key != nil {
			r.PrivateKey = describePrivateKey(in, in.CSR.PublicKey)
			if !*r.PrivateKey.Matches {
				add(Problem{CodeKeyMismatch, fmt.Sprintf("private key (%s) does not match the CSR's public key (%s)",
					r.PrivateKey.PublicKey.Type, d.PublicKey.Type)})
			}
		}
	case len(in.Certs) == 0: // a key on its own
		r.PrivateKey = &PrivateKey{Source: keySource(in), PublicKey: describeKey(in.Key.Public())}
		for _, other := range all {
			if other != in && other.KeyName == in.Name && len(other.Certs) != 0 {
				m := certs.KeyMatches(other.Certs[0].PublicKey, in.Key)
				r.PrivateKey.Matches = &m
				if !m {
					add(Problem{CodeKeyMismatch, fmt.Sprintf("private key (%s) does not match %s in %s (%s)",
						r.PrivateKey.PublicKey.Type, label(other, 0), displayName(other.Name), certs.KeyTypeOf(other.Certs[0].PublicKey))})
				}
			}
		}
	case in.Bundle:
		add(timeProblems(in, opts)...)
		add(bundleProblems(in, opts)...)
		if len(opts.Roots) != 0 && opts.RootsName != in.Name {
			r.VerifiedAgainst = opts.RootsName
		}
	default:
		add(timeProblems(in, opts)...)
		ps, verified := chainProblems(in, roots, rootsName, opts.Now)
		add(ps...)
		if verified {
			r.VerifiedAgainst = rootsName
		}
		if r.Type == TypeChain {
			add(spiffeProblems(in, roots, rootsName, opts)...)
		} else {
			add(caProblems(in)...)
		}
	}
	if len(in.Certs) != 0 && in.Key != nil {
		r.PrivateKey = describePrivateKey(in, in.Certs[0].PublicKey)
		if !*r.PrivateKey.Matches {
			add(Problem{CodeKeyMismatch, fmt.Sprintf("private key from %s (%s) does not match %s (%s)",
				displayName(keySource(in)), r.PrivateKey.PublicKey.Type, label(in, 0), certs.KeyTypeOf(in.Certs[0].PublicKey))})
		}
	}
	r.Valid = true
	for _, p := range r.Problems {
		if p.Code != CodeExpiring {
			r.Valid = false
		}
	}
	return r
}

func keySource(in *Input) string {
	if in.KeyName != "" {
		return displayName(in.KeyName)
	}
	return displayName(in.Name)
}

func describePrivateKey(in *Input, pub any) *PrivateKey {
	m := certs.KeyMatches(pub, in.Key)
	return &PrivateKey{Source: keySource(in), PublicKey: describeKey(in.Key.Public()), Matches: &m}
}

// timeProblems reports expired, not yet valid and expiring certificates.
func timeProblems(in *Input, opts Options) []Problem {
	var ps []Problem
	for i, c := range in.Certs {
		ps = append(ps, timeProblem(label(in, i), c, opts)...)
	}
	return ps
}

func timeProblem(what string, c *x509.Certificate, opts Options) []Problem {
	now := opts.Now
	switch {
	case now.Before(c.NotBefore):
		return []Problem{{CodeNotYetValid, fmt.Sprintf("%s is not yet valid: it becomes valid at %s (in %s)",
			what, stamp(c.NotBefore), Ago(c.NotBefore.Sub(now)))}}
	case now.After(c.NotAfter):
		return []Problem{{CodeExpired, fmt.Sprintf("%s expired at %s (%s ago)",
			what, stamp(c.NotAfter), Ago(now.Sub(c.NotAfter)))}}
	case opts.ExpiresWithin > 0 && c.NotAfter.Sub(now) < opts.ExpiresWithin:
		return []Problem{{CodeExpiring, fmt.Sprintf("%s expires at %s, in %s, within %s",
			what, stamp(c.NotAfter), ExpiresIn(c.NotAfter.Sub(now)), shortDuration(opts.ExpiresWithin))}}
	}
	return nil
}

// bundleProblems checks each trust anchor: it must be a CA, a self-signed
// one must carry a good self-signature, and with explicit roots it must be
// one of them (or chain to them).
func bundleProblems(in *Input, opts Options) []Problem {
	var ps []Problem
	for i, c := range in.Certs {
		what := label(in, i)
		if !c.IsCA {
			ps = append(ps, Problem{CodeInvalid, fmt.Sprintf("%s is in a trust bundle but is not a CA", what)})
		}
		if string(c.RawIssuer) == string(c.RawSubject) && !selfSigned(c) {
			ps = append(ps, Problem{CodeInvalid, fmt.Sprintf("%s names itself as issuer but its self-signature does not verify", what)})
		}
		if len(opts.Roots) != 0 && opts.RootsName != in.Name {
			single := &Input{Name: in.Name, Certs: []*x509.Certificate{c}, Bundle: true}
			if p := trustProblems(single, opts.Roots, opts.RootsName, opts.Now); p != nil {
				ps = append(ps, p...)
			}
		}
	}
	return ps
}

// caProblems checks a signing CA: its key usage must allow signing.
func caProblems(in *Input) []Problem {
	c := in.Certs[0]
	if c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return []Problem{{CodeInvalid, fmt.Sprintf("%s is a CA but its key usage lacks Cert Sign", label(in, 0))}}
	}
	return nil
}

// spiffeProblems checks the leaf against the SPIFFE X509-SVID rules and
// the expected trust domain.
func spiffeProblems(in *Input, roots []*x509.Certificate, rootsName string, opts Options) []Problem {
	leaf := in.Certs[0]
	what := label(in, 0)
	var ps []Problem
	switch n := len(leaf.URIs); {
	case n == 0 && opts.AllowDNS && len(leaf.DNSNames) != 0:
		return nil // a DNS-named leaf, accepted with --allow-dns
	case n == 0 && len(leaf.DNSNames) != 0:
		return []Problem{{CodeNotSPIFFE, fmt.Sprintf("%s is not a SPIFFE leaf: it has DNS SANs and no URI SAN (a gateway certificate? --allow-dns accepts it)", what)}}
	case n == 0:
		return []Problem{{CodeNotSPIFFE, fmt.Sprintf("%s is not a SPIFFE leaf: it has no URI SAN, so no SPIFFE ID", what)}}
	case n > 1:
		return []Problem{{CodeNotSPIFFE, fmt.Sprintf("%s is not a SPIFFE leaf: it has %d URI SANs, a SPIFFE X509-SVID has exactly one", what, n)}}
	}
	id, err := spiffeid.FromURI(leaf.URIs[0])
	if err != nil {
		return []Problem{{CodeNotSPIFFE, fmt.Sprintf("%s is not a SPIFFE leaf: URI SAN %q is not a SPIFFE ID (%s)",
			what, leaf.URIs[0].String(), strings.TrimPrefix(err.Error(), "spiffeid: "))}}
	}
	if leaf.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		ps = append(ps, Problem{CodeNotSPIFFE, fmt.Sprintf("%s is not a SPIFFE leaf: its key usage lacks Digital Signature", what)})
	}
	if leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0 {
		ps = append(ps, Problem{CodeNotSPIFFE, fmt.Sprintf("%s is not a SPIFFE leaf: its key usage includes Cert Sign or CRL Sign", what)})
	}
	if !opts.TrustDomain.IsZero() && id.TrustDomain() != opts.TrustDomain {
		ps = append(ps, Problem{CodeNameMismatch, fmt.Sprintf("%s is in trust domain %q, want %q",
			what, id.TrustDomain().Name(), opts.TrustDomain.Name())})
	}
	// Roots that declare their trust domain (a spiffe://<td> URI SAN, as
	// SPIRE's and meshid's do) must declare the leaf's.
	var declared []string
	for _, root := range roots {
		for _, u := range root.URIs {
			if rid, err := spiffeid.FromURI(u); err == nil {
				if rid.TrustDomain() == id.TrustDomain() {
					return ps
				}
				declared = append(declared, rid.TrustDomain().Name())
			}
		}
	}
	if len(declared) != 0 {
		ps = append(ps, Problem{CodeNameMismatch, fmt.Sprintf("%s is in trust domain %q, but the roots in %s are for %s",
			what, id.TrustDomain().Name(), displayName(rootsName), strings.Join(quoteAll(declared), ", "))})
	}
	return ps
}

func csrProblems(r *x509.CertificateRequest, d CSR) []Problem {
	var ps []Problem
	if !d.SignatureValid {
		ps = append(ps, Problem{CodeInvalid, "CSR signature does not verify (no proof of possession of the key)"})
	}
	switch n := len(r.URIs); {
	case n == 0:
		ps = append(ps, Problem{CodeNotSPIFFE, "CSR has no URI SAN, so no SPIFFE ID"})
	case n > 1:
		ps = append(ps, Problem{CodeNotSPIFFE, fmt.Sprintf("CSR has %d URI SANs; a SPIFFE CSR has exactly one", n)})
	default:
		if _, err := spiffeid.FromURI(r.URIs[0]); err != nil {
			ps = append(ps, Problem{CodeNotSPIFFE, fmt.Sprintf("CSR URI SAN %q is not a SPIFFE ID (%s)",
				r.URIs[0].String(), strings.TrimPrefix(err.Error(), "spiffeid: "))})
		}
	}
	return ps
}

// label names certificate i of an input in messages: its role, then its
// SPIFFE ID, or its subject, or a DNS name, or its serial.
func label(in *Input, i int) string {
	c := in.Certs[i]
	role := "intermediate"
	switch {
	case in.Bundle:
		role = "root"
	case i == 0 && c.IsCA:
		role = "CA"
	case i == 0:
		role = "leaf"
	case selfSigned(c):
		role = "root"
	}
	return role + " " + certName(c)
}

func certName(c *x509.Certificate) string {
	if id := spiffeID(c); id != "" && !c.IsCA {
		return id
	}
	if s := c.Subject.String(); s != "" {
		return fmt.Sprintf("%q", s)
	}
	if len(c.DNSNames) != 0 {
		return "DNS:" + c.DNSNames[0]
	}
	if id := spiffeID(c); id != "" {
		return id
	}
	return "with serial " + Serial(c)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// shortDuration prints 24h instead of 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}
