package podcert

import (
	"crypto/x509"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
)

// The API server's bounds on an issued status
// (k8s.io/kubernetes pkg/apis/certificates/validation,
// ValidatePodCertificateRequestStatusUpdate).
const (
	minLifetime   = time.Hour        // notAfter - notBefore
	refreshMargin = 10 * time.Minute // beginRefreshAt in [notBefore+10m, notAfter-10m]
	// defaultMaxExpiration is the API server's default of
	// spec.maxExpirationSeconds.
	defaultMaxExpiration = 86400 * time.Second
)

// maxLifetime is the longest lifetime pcr allows.
func maxLifetime(pcr *certificatesv1.PodCertificateRequest) time.Duration {
	if s := pcr.Spec.MaxExpirationSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return defaultMaxExpiration
}

// ttl is the TTL to ask the Authority for at now, so that the leaf lives
// exactly the lifetime the issue names, min(spec.maxExpirationSeconds,
// MaxTTL, DefaultTTL) but at least an hour: the API server bounds
// notAfter - notBefore, and the Authority backdates notBefore by
// ca.DefaultClockSkew, but never before its own certificate's notBefore
// (a CA made a moment ago). The leaf's times are whole seconds, and so is
// the lifetime; a CA that expires sooner still cuts it (checkLifetime).
func (c *Controller) ttl(pcr *certificatesv1.PodCertificateRequest, now time.Time) time.Duration {
	life := max(min(maxLifetime(pcr), c.cfg.MaxTTL, c.cfg.DefaultTTL), minLifetime)
	notBefore := now.Add(-ca.DefaultClockSkew)
	if b := c.cfg.Roots.Bundle(); b != nil && b.Cert.NotBefore.After(notBefore) {
		notBefore = b.Cert.NotBefore
	}
	return life - now.Sub(notBefore)
}

// checkLifetime reports whether leaf's lifetime is one the API server
// accepts for pcr.
func checkLifetime(pcr *certificatesv1.PodCertificateRequest, leaf *x509.Certificate) error {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	if life < minLifetime || life > maxLifetime(pcr) {
		return fmt.Errorf("the leaf's lifetime %s is outside [%s, spec.maxExpirationSeconds %s]", life, minLifetime, maxLifetime(pcr))
	}
	return nil
}

// issuedStatus is the status of a request answered with iss: the chain
// (leaf first, then what lies between it and the roots), the leaf's own
// times, and the refresh time at the agent's renewal point inside the
// API server's bounds.
func (c *Controller) issuedStatus(pcr *certificatesv1.PodCertificateRequest, iss *ca.Issued, now time.Time) certificatesv1.PodCertificateRequestStatus {
	leaf := iss.Leaf
	refresh := certs.RenewAt(leaf.NotBefore, leaf.NotAfter, c.cfg.GraceRatio, c.cfg.Jitter)
	refresh = refreshWithin(refresh, leaf.NotBefore, leaf.NotAfter)
	return certificatesv1.PodCertificateRequestStatus{
		Conditions:       []metav1.Condition{condition(pcr, certificatesv1.PodCertificateRequestConditionTypeIssued, reasonIssued, "issued "+leaf.URIs[0].String(), now)},
		CertificateChain: string(certs.EncodeCertificates(append([]*x509.Certificate{leaf}, iss.Chain...)...)),
		NotBefore:        &metav1.Time{Time: leaf.NotBefore},
		BeginRefreshAt:   &metav1.Time{Time: refresh},
		NotAfter:         &metav1.Time{Time: leaf.NotAfter},
	}
}

// refreshWithin moves t into [notBefore+10m, notAfter-10m], in whole
// seconds (the status' times travel as RFC 3339 seconds).
func refreshWithin(t, notBefore, notAfter time.Time) time.Time {
	lo, hi := notBefore.Add(refreshMargin), notAfter.Add(-refreshMargin)
	t = t.Truncate(time.Second)
	if t.Before(lo) {
		t = lo
	}
	if t.After(hi) {
		t = hi
	}
	return t
}

// condition is the one terminal condition of a status.
func condition(pcr *certificatesv1.PodCertificateRequest, typ, reason, message string, now time.Time) metav1.Condition {
	return metav1.Condition{
		Type:               typ,
		Status:             metav1.ConditionTrue,
		ObservedGeneration: pcr.Generation,
		LastTransitionTime: metav1.NewTime(now.Truncate(time.Second)),
		Reason:             reason,
		Message:            message,
	}
}

// terminal reports whether pcr has its answer already.
func terminal(pcr *certificatesv1.PodCertificateRequest) bool {
	for _, c := range pcr.Status.Conditions {
		switch c.Type {
		case certificatesv1.PodCertificateRequestConditionTypeIssued,
			certificatesv1.PodCertificateRequestConditionTypeDenied,
			certificatesv1.PodCertificateRequestConditionTypeFailed:
			return true
		}
	}
	return false
}
