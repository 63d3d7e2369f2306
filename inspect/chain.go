package inspect

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/meshid/meshid/certs"
)

// chainProblems checks that each certificate of the chain is issued by the
// next one (names and signatures), then that the chain leads to roots.
// verified reports whether a path to the roots was found.
func chainProblems(in *Input, roots []*x509.Certificate, rootsName string, now time.Time) (ps []Problem, verified bool) {
	for i := 0; i+1 < len(in.Certs); i++ {
		c, next := in.Certs[i], in.Certs[i+1]
		if !bytes.Equal(c.RawIssuer, next.RawSubject) {
			ps = append(ps, Problem{CodeNameMismatch, fmt.Sprintf("%s names its issuer %q, but the next certificate in the chain is %s (wrong order or wrong intermediate?)",
				label(in, i), c.Issuer.String(), label(in, i+1))})
			continue
		}
		if err := c.CheckSignatureFrom(next); err != nil {
			var cv x509.ConstraintViolationError
			if errors.As(err, &cv) {
				ps = append(ps, Problem{CodeInvalid, fmt.Sprintf("%s cannot have signed %s: it is not a CA", label(in, i+1), label(in, i))})
			} else {
				ps = append(ps, Problem{CodeUnknownIssuer, fmt.Sprintf("%s is not signed by the next certificate in the chain, %s (same name, different key?)",
					label(in, i), label(in, i+1))})
			}
		}
	}
	if len(ps) != 0 || len(roots) == 0 {
		return ps, false
	}
	ps = trustProblems(in, roots, rootsName, now)
	for _, p := range ps {
		switch p.Code {
		case CodeExpired, CodeNotYetValid, CodeExpiring:
		default:
			return ps, false
		}
	}
	return ps, true
}

// trustProblems verifies in.Certs[0] with in.Certs[1:] as intermediates
// against roots. crypto/x509 does the path building (name constraints, path
// length, key usage); this function turns its errors into words. Because
// x509 reports any time failure first, verification is retried at the
// instants where the validity windows start and end: if a path exists at
// some instant, only the time problems of its root remain to report (those
// of the input's own certificates are reported by timeProblems).
func trustProblems(in *Input, roots []*x509.Certificate, rootsName string, now time.Time) []Problem {
	var structural error
	for _, t := range candidateTimes(now, in.Certs, roots) {
		chains, err := certs.VerifyChain(in.Certs, roots, t)
		if err == nil {
			root := chains[0][len(chains[0])-1]
			for _, c := range in.Certs {
				if c.Equal(root) {
					return nil // its time problems are already reported
				}
			}
			return timeProblem(fmt.Sprintf("trusted root %s in %s", certName(root), displayName(rootsName)), root, Options{Now: now})
		}
		if structural == nil && !isTimeError(err) {
			structural = err
		}
	}
	if structural == nil {
		return []Problem{{CodeInvalid, fmt.Sprintf("%s and the roots in %s are never valid at the same time", label(in, 0), displayName(rootsName))}}
	}
	return []Problem{classify(structural, in, roots, rootsName)}
}

// candidateTimes is now followed by every validity boundary, in order.
func candidateTimes(now time.Time, lists ...[]*x509.Certificate) []time.Time {
	var ts []time.Time
	for _, l := range lists {
		for _, c := range l {
			ts = append(ts, c.NotBefore, c.NotAfter)
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return append([]time.Time{now}, ts...)
}

func isTimeError(err error) bool {
	var ci x509.CertificateInvalidError
	return errors.As(err, &ci) && ci.Reason == x509.Expired
}

// classify explains a crypto/x509 verification error.
func classify(err error, in *Input, roots []*x509.Certificate, rootsName string) Problem {
	where := displayName(rootsName)
	name := func(c *x509.Certificate) string {
		if c == nil {
			return label(in, 0)
		}
		for i, x := range in.Certs {
			if x.Equal(c) {
				return label(in, i)
			}
		}
		return "certificate " + certName(c)
	}
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		c := ua.Cert
		if c == nil {
			c = in.Certs[len(in.Certs)-1]
		}
		if selfSigned(c) {
			return Problem{CodeUnknownIssuer, fmt.Sprintf("unknown issuer: %s is not one of the trusted roots in %s", name(c), where)}
		}
		msg := fmt.Sprintf("unknown issuer: %s was issued by %q, which does not chain to the trusted roots in %s", name(c), c.Issuer.String(), where)
		for _, r := range roots {
			if bytes.Equal(r.RawSubject, c.RawIssuer) {
				msg += fmt.Sprintf(" (a root named %q is there, but it did not sign this certificate: a different CA with the same name?)", r.Subject.String())
				break
			}
		}
		return Problem{CodeUnknownIssuer, msg}
	}
	var ci x509.CertificateInvalidError
	if errors.As(err, &ci) {
		switch ci.Reason {
		case x509.NotAuthorizedToSign:
			return Problem{CodeInvalid, fmt.Sprintf("%s is not a CA but is needed to sign the chain", name(ci.Cert))}
		case x509.TooManyIntermediates:
			return Problem{CodeInvalid, fmt.Sprintf("path length constraint exceeded: %s allows at most %d CA(s) below it", name(ci.Cert), ci.Cert.MaxPathLen)}
		case x509.CANotAuthorizedForThisName, x509.NameConstraintsWithoutSANs, x509.UnconstrainedName:
			return Problem{CodeNameMismatch, fmt.Sprintf("name constraints do not permit %s: %s", name(ci.Cert), ci.Detail)}
		case x509.CANotAuthorizedForExtKeyUsage, x509.IncompatibleUsage:
			return Problem{CodeInvalid, fmt.Sprintf("the extended key usage of %s is not allowed by its issuers", name(ci.Cert))}
		}
		return Problem{CodeInvalid, fmt.Sprintf("%s: %s", name(ci.Cert), ci.Error())}
	}
	var he x509.HostnameError
	if errors.As(err, &he) {
		return Problem{CodeNameMismatch, he.Error()}
	}
	return Problem{CodeInvalid, fmt.Sprintf("chain does not verify against %s: %v", where, err)}
}
