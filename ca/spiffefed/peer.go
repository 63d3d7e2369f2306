package spiffefed

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Profile is a bundle endpoint profile of the SPIFFE Federation spec.
type Profile string

// The two profiles.
const (
	// ProfileSPIFFE: the endpoint presents an X509-SVID of a known SPIFFE
	// ID, verified with the trust domain's own bundle.
	ProfileSPIFFE Profile = "https_spiffe"
	// ProfileWeb: the endpoint presents a Web PKI certificate for its
	// host name.
	ProfileWeb Profile = "https_web"
	// DefaultProfile is the profile of a peer or endpoint that names none.
	DefaultProfile = ProfileSPIFFE
)

// ParseProfile returns the profile named s; empty is DefaultProfile.
func ParseProfile(s string) (Profile, error) {
	switch p := Profile(s); p {
	case "":
		return DefaultProfile, nil
	case ProfileSPIFFE, ProfileWeb:
		return p, nil
	}
	return "", fmt.Errorf("spiffefed: unknown bundle endpoint profile %q (want %s or %s)", s, ProfileSPIFFE, ProfileWeb)
}

// MaxPeerSpec bounds one --federate-with value, in bytes.
const MaxPeerSpec = 4096

// Peer is one federated trust domain: where its bundle endpoint is and how
// to authenticate it.
type Peer struct {
	TrustDomain spiffeid.TrustDomain
	// URL is the bundle endpoint (https only).
	URL string
	// Profile is how the endpoint is authenticated.
	Profile Profile
	// EndpointID is the SPIFFE ID the endpoint presents (https_spiffe).
	EndpointID spiffeid.ID
	// BundleFile is the bootstrap bundle (https_spiffe): a SPIFFE bundle
	// (JWKS) or PEM roots of TrustDomain. A bundle persisted by an earlier
	// run with a higher sequence takes its place.
	BundleFile string
	// CAFile holds PEM roots added to the system's to verify an https_web
	// endpoint.
	CAFile string
}

// ParsePeer parses a --federate-with value:
// TD=URL[,profile=https_web|https_spiffe][,endpoint-id=SPIFFE_ID][,bundle=PATH][,ca-file=PATH].
// https_spiffe (the default) needs endpoint-id; ca-file is only for
// https_web and endpoint-id only for https_spiffe.
func ParsePeer(s string) (Peer, error) {
	var p Peer
	if len(s) > MaxPeerSpec {
		return p, fmt.Errorf("spiffefed: a --federate-with value of %d bytes is longer than %d", len(s), MaxPeerSpec)
	}
	td, rest, ok := strings.Cut(s, "=")
	if !ok {
		return p, fmt.Errorf("spiffefed: %q is not TD=URL[,option=value...]", s)
	}
	var err error
	if p.TrustDomain, err = spiffeid.TrustDomainFromString(td); err != nil {
		return p, fmt.Errorf("spiffefed: trust domain %q: %w", td, err)
	}
	fields := strings.Split(rest, ",")
	if p.URL, err = checkURL(fields[0]); err != nil {
		return p, err
	}
	seen := map[string]bool{}
	var profile string
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || v == "" {
			return p, fmt.Errorf("spiffefed: %s: option %q is not key=value", p.TrustDomain, f)
		}
		if seen[k] {
			return p, fmt.Errorf("spiffefed: %s: option %s given twice", p.TrustDomain, k)
		}
		seen[k] = true
		switch k {
		case "profile":
			profile = v
		case "endpoint-id":
			if p.EndpointID, err = spiffeid.FromString(v); err != nil {
				return p, fmt.Errorf("spiffefed: %s: endpoint-id %q: %w", p.TrustDomain, v, err)
			}
		case "bundle":
			p.BundleFile = v
		case "ca-file":
			p.CAFile = v
		default:
			return p, fmt.Errorf("spiffefed: %s: unknown option %q (want profile, endpoint-id, bundle or ca-file)", p.TrustDomain, k)
		}
	}
	if p.Profile, err = ParseProfile(profile); err != nil {
		return p, err
	}
	return p, p.check()
}

// check validates the combination of options.
func (p Peer) check() error {
	switch p.Profile {
	case ProfileSPIFFE:
		if p.EndpointID.IsZero() {
			return fmt.Errorf("spiffefed: %s: profile https_spiffe needs endpoint-id (the SPIFFE ID the bundle endpoint presents)", p.TrustDomain)
		}
		if p.CAFile != "" {
			return fmt.Errorf("spiffefed: %s: ca-file is for profile https_web; https_spiffe is verified with the trust domain's bundle", p.TrustDomain)
		}
	case ProfileWeb:
		if !p.EndpointID.IsZero() {
			return fmt.Errorf("spiffefed: %s: endpoint-id is for profile https_spiffe", p.TrustDomain)
		}
	}
	return nil
}

// checkURL accepts an https URL with a host and without user information
// or fragment.
func checkURL(s string) (string, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("spiffefed: bundle endpoint URL: %w", err)
	case u.Scheme != "https":
		return "", fmt.Errorf("spiffefed: bundle endpoint URL %q: the scheme must be https", s)
	case u.Host == "":
		return "", fmt.Errorf("spiffefed: bundle endpoint URL %q has no host", s)
	case u.User != nil:
		return "", errors.New("spiffefed: bundle endpoint URL: user information is not allowed")
	case u.Fragment != "":
		return "", fmt.Errorf("spiffefed: bundle endpoint URL %q has a fragment", s)
	}
	return s, nil
}

// ParsePeers parses every value and refuses a trust domain given twice or
// equal to own: trust domains are never merged.
func ParsePeers(values []string, own spiffeid.TrustDomain) ([]Peer, error) {
	if len(values) == 0 {
		return nil, nil
	}
	out := make([]Peer, 0, len(values))
	seen := map[spiffeid.TrustDomain]bool{}
	for _, v := range values {
		p, err := ParsePeer(v)
		if err != nil {
			return nil, err
		}
		if err := checkPeerSet(p, own, seen); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func checkPeerSet(p Peer, own spiffeid.TrustDomain, seen map[spiffeid.TrustDomain]bool) error {
	if p.TrustDomain == own {
		return fmt.Errorf("spiffefed: %s is this CA's own trust domain: it cannot be federated with", own)
	}
	if seen[p.TrustDomain] {
		return fmt.Errorf("spiffefed: trust domain %s given twice", p.TrustDomain)
	}
	seen[p.TrustDomain] = true
	return nil
}
