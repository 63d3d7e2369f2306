package podcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"slices"
	"sort"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/identity"
)

// Reasons of the Denied and Failed conditions, besides the two the API
// names (UnsupportedKeyType, InvalidUnverifiedUserAnnotations).
const (
	reasonIssued            = "Issued"
	reasonPodMismatch       = "PodMismatch"
	reasonNodeMismatch      = "NodeMismatch"
	reasonAccountMismatch   = "ServiceAccountMismatch"
	reasonInvalidRequest    = "InvalidRequest"
	reasonSigningRefused    = "SigningRefused"
	reasonLifetime          = "LifetimeNotAllowed"
	reasonSigningFailed     = "SigningFailed"
	reasonUnsupportedKey    = certificatesv1.PodCertificateRequestConditionUnsupportedKeyType
	reasonInvalidAnnotation = certificatesv1.PodCertificateRequestConditionInvalidUserConfig
)

// SupportedKeyTypes are the kubelet's key types (the podCertificate
// volume's keyType) that the CA signs; ECDSAP521 is the one it does not
// (ca's leaf key policy: RSA 2048..8192 bits, P-256, P-384, Ed25519).
var SupportedKeyTypes = []string{"ECDSAP256", "ECDSAP384", "ED25519", "RSA3072", "RSA4096"}

// DocumentedAnnotations are the spec.unverifiedUserAnnotations keys the
// signer understands: none. A request with any key is denied, as the API
// asks of a signer.
var DocumentedAnnotations []string

// denial is a request the signer refuses for good: the Denied condition's
// reason and message.
type denial struct {
	reason, message string
}

func (d *denial) Error() string { return d.reason + ": " + d.message }

func deny(reason, format string, args ...any) *denial {
	return &denial{reason: reason, message: fmt.Sprintf(format, args...)}
}

// accepted is a request that may be signed: the verified CSR (its key) and
// the identity.
type accepted struct {
	csr *ca.CSR
	id  spiffeid.ID
}

// judge checks pcr. It returns what to sign, a *denial, or another error
// (the cluster could not be read: retry).
func (c *Controller) judge(ctx context.Context, o *objects, pcr *certificatesv1.PodCertificateRequest) (*accepted, error) {
	spec := &pcr.Spec
	if len(spec.UnverifiedUserAnnotations) > 0 {
		keys := make([]string, 0, len(spec.UnverifiedUserAnnotations))
		for k := range spec.UnverifiedUserAnnotations {
			if !slices.Contains(DocumentedAnnotations, k) {
				keys = append(keys, k)
			}
		}
		if len(keys) > 0 {
			sort.Strings(keys)
			return nil, deny(reasonInvalidAnnotation, "spec.unverifiedUserAnnotations: key %q is not one this signer documents (it documents none)", truncate(keys[0]))
		}
	}
	csr, err := x509.ParseCertificateRequest(spec.StubPKCS10Request)
	if err != nil {
		return nil, deny(reasonInvalidRequest, "spec.stubPKCS10Request does not parse: %v", err)
	}
	if kt := keyType(csr.PublicKey); !slices.Contains(SupportedKeyTypes, kt) {
		return nil, deny(reasonUnsupportedKey, "key type %s is not supported; use ECDSAP256 (supported: %v)", kt, SupportedKeyTypes)
	}
	verified, err := ca.VerifyCSR(csr)
	if err != nil {
		return nil, deny(reasonInvalidRequest, "spec.stubPKCS10Request: %v", err)
	}
	if d, err := c.checkObjects(ctx, o, pcr); d != nil || err != nil {
		if d != nil {
			return nil, d
		}
		return nil, err
	}
	id, err := identity.ServiceAccount{Namespace: pcr.Namespace, Name: spec.ServiceAccountName}.ID(c.cfg.TrustDomain)
	if err != nil {
		return nil, deny(reasonAccountMismatch, "spec.serviceAccountName %q makes no SPIFFE ID: %v", truncate(spec.ServiceAccountName), err)
	}
	return &accepted{csr: verified, id: id}, nil
}

// checkObjects compares the spec with the live pod, node and service
// account. It returns a denial naming the first field that does not
// match, or an error when the cluster could not be read.
func (c *Controller) checkObjects(ctx context.Context, o *objects, pcr *certificatesv1.PodCertificateRequest) (*denial, error) {
	spec := &pcr.Spec
	ref := pcr.Namespace + "/" + spec.PodName
	pod, err := o.pod(ctx, pcr.Namespace, spec.PodName, spec.PodUID)
	switch {
	case err != nil:
		return nil, err
	case pod == nil:
		return deny(reasonPodMismatch, "spec.podName: no pod %s exists", truncate(ref)), nil
	case pod.UID != spec.PodUID:
		return deny(reasonPodMismatch, "spec.podUID: pod %s has UID %s, not %s", ref, pod.UID, truncate(string(spec.PodUID))), nil
	case pod.Spec.NodeName != string(spec.NodeName):
		return deny(reasonNodeMismatch, "spec.nodeName: pod %s runs on node %q, not %q", ref, pod.Spec.NodeName, truncate(string(spec.NodeName))), nil
	case pod.Spec.ServiceAccountName != spec.ServiceAccountName:
		return deny(reasonAccountMismatch, "spec.serviceAccountName: pod %s runs as %q, not %q", ref, pod.Spec.ServiceAccountName, truncate(spec.ServiceAccountName)), nil
	case !slices.Contains(podCertificateSigners(pod), c.cfg.SignerName):
		return deny(reasonPodMismatch, "spec.signerName: pod %s mounts no podCertificate volume of signer %s", ref, c.cfg.SignerName), nil
	}
	nodeUID, err := o.nodeUID(ctx, string(spec.NodeName), spec.NodeUID)
	switch {
	case err != nil:
		return nil, err
	case nodeUID == "":
		return deny(reasonNodeMismatch, "spec.nodeName: no node %q exists", truncate(string(spec.NodeName))), nil
	case nodeUID != spec.NodeUID:
		return deny(reasonNodeMismatch, "spec.nodeUID: node %s has UID %s, not %s", spec.NodeName, nodeUID, truncate(string(spec.NodeUID))), nil
	}
	saUID, err := o.serviceAccountUID(ctx, pcr.Namespace, spec.ServiceAccountName, spec.ServiceAccountUID)
	switch {
	case err != nil:
		return nil, err
	case saUID == "":
		return deny(reasonAccountMismatch, "spec.serviceAccountName: no service account %s/%s exists", pcr.Namespace, truncate(spec.ServiceAccountName)), nil
	case saUID != spec.ServiceAccountUID:
		return deny(reasonAccountMismatch, "spec.serviceAccountUID: service account %s/%s has UID %s, not %s", pcr.Namespace, spec.ServiceAccountName, saUID, truncate(string(spec.ServiceAccountUID))), nil
	}
	return nil, nil
}

// keyType names pub as the podCertificate volume's keyType does.
func keyType(pub any) string {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA%d", k.N.BitLen())
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ECDSAP256"
		case elliptic.P384():
			return "ECDSAP384"
		case elliptic.P521():
			return "ECDSAP521"
		}
		return "ECDSA-" + k.Curve.Params().Name
	case ed25519.PublicKey:
		return "ED25519"
	}
	return fmt.Sprintf("%T", pub)
}

// maxEchoed is the longest piece of request input quoted in a message.
const maxEchoed = 128

func truncate(s string) string {
	if len(s) <= maxEchoed {
		return s
	}
	return s[:maxEchoed] + "…"
}
