package upstream

import (
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// CheckNames refuses an intermediate whose own name constraints would
// make every leaf it signs fail verification: permitted URI domains that
// leave out the trust domain's host, or excluded ones that include it.
// (DNS, IP and email constraints bind other name forms than the leaves'
// one URI SAN, so they are not judged here.) Go's verification
// applies a CA's constraints to the names below it, not to the CA's own
// names, so Check's chain verification cannot see this: an upstream
// profile with name constraints for another domain would otherwise be
// accepted and every workload handshake would fail at once.
func CheckNames(c *x509.Certificate, td spiffeid.TrustDomain) error {
	host := td.Name()
	if len(c.PermittedURIDomains) > 0 {
		ok := false
		for _, p := range c.PermittedURIDomains {
			ok = ok || matchDomain(host, p)
		}
		if !ok {
			return fmt.Errorf("%w: %q permits URIs only in %v: leaves of spiffe://%s would not verify", ErrRefused, c.Subject, c.PermittedURIDomains, host)
		}
	}
	for _, e := range c.ExcludedURIDomains {
		if matchDomain(host, e) {
			return fmt.Errorf("%w: %q excludes URIs in %q: leaves of spiffe://%s would not verify", ErrRefused, c.Subject, e, host)
		}
	}
	return nil
}

// matchDomain is RFC 5280's domain constraint as Go's x509 applies it to
// URI hosts: "example.org" matches it and its subdomains, ".example.org"
// only its subdomains; labels compare without case.
func matchDomain(host, constraint string) bool {
	if constraint == "" {
		return true
	}
	sub := strings.HasPrefix(constraint, ".")
	constraint = strings.TrimPrefix(constraint, ".")
	h, c := strings.Split(host, "."), strings.Split(constraint, ".")
	if len(h) < len(c) || (sub && len(h) == len(c)) {
		return false
	}
	for i := 1; i <= len(c); i++ {
		if !strings.EqualFold(h[len(h)-i], c[len(c)-i]) {
			return false
		}
	}
	return true
}
