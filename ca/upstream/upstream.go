package upstream

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/meshid/meshid/certs"
)

// Authority is an upstream CA: MintX509CA has it sign csr (DER) as an
// intermediate CA for about ttl (the upstream may choose another lifetime;
// Check judges it). SPIRE's UpstreamAuthority shape; root changes between
// mints are RootSource, a second, optional interface, so that a backend
// that cannot report them stays this one method.
type Authority interface {
	MintX509CA(ctx context.Context, csr []byte, ttl time.Duration) (*Minted, error)
}

// RootSource is implemented by an Authority that can say what its roots
// are without a mint (SPIRE's stream of upstream root updates, as a poll).
// The Renewer asks every RenewerConfig.RootCheck; when the answer differs
// from the roots of the newest intermediate, it mints at once, and the
// rotation publishes the union of old and new roots before anything signed
// under a new one is served.
type RootSource interface {
	FetchRoots(ctx context.Context) ([]*x509.Certificate, error)
}

// Minted is an upstream's answer.
type Minted struct {
	// Chain is the new intermediate first, then the certificates between
	// it and a root, in issuer order (no root).
	Chain []*x509.Certificate
	// Roots are the upstream's trust anchors: the trust bundle meshid
	// publishes.
	Roots []*x509.Certificate
}

// ErrRefused wraps every reason Check refuses an answer.
var ErrRefused = errors.New("upstream answer refused")

// Check refuses an answer that is not a CA certificate for pub, whose
// chain does not verify to its roots at now, or that is valid for less
// than minLife from now (it would be due for renewal before the next one).
func Check(m *Minted, pub crypto.PublicKey, now time.Time, minLife time.Duration) error {
	if m == nil || len(m.Chain) == 0 {
		return fmt.Errorf("%w: no certificate", ErrRefused)
	}
	if len(m.Roots) == 0 {
		return fmt.Errorf("%w: no root", ErrRefused)
	}
	c := m.Chain[0]
	if !c.BasicConstraintsValid || !c.IsCA {
		return fmt.Errorf("%w: %q is not a CA certificate (basicConstraints CA:true missing): check the upstream profile's ca_constraint", ErrRefused, c.Subject)
	}
	if c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("%w: %q may not sign certificates (keyUsage lacks cert sign)", ErrRefused, c.Subject)
	}
	if !samePublicKey(c.PublicKey, pub) {
		return fmt.Errorf("%w: %q is not for the key meshid asked for", ErrRefused, c.Subject)
	}
	chains, err := certs.VerifyChain(m.Chain, m.Roots, now)
	if err == nil {
		err = checkPathLen(chains)
	}
	if err != nil {
		return fmt.Errorf("%w: the chain does not verify to the roots returned: %v", ErrRefused, err)
	}
	if left := c.NotAfter.Sub(now); left < minLife {
		return fmt.Errorf("%w: %q is valid for %v, less than the renewal period %v", ErrRefused, c.Subject, left.Round(time.Second), minLife)
	}
	return nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	da, err1 := x509.MarshalPKIXPublicKey(a)
	db, err2 := x509.MarshalPKIXPublicKey(b)
	return err1 == nil && err2 == nil && bytes.Equal(da, db)
}

// URL is a parsed --upstream: Scheme names the backend ("cfssl+https").
type URL struct {
	Scheme string
	Host   string // host:port
	Query  url.Values
}

// String is the URL as given, for logs (it holds no secret).
func (u *URL) String() string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, RawQuery: u.Query.Encode()}).String()
}

// MaxURLLength bounds --upstream.
const MaxURLLength = 2048

// ParseURL parses an --upstream value: SCHEME://HOST:PORT?QUERY, without a
// path, user or fragment. Which schemes and keys are allowed is the
// backend's business.
func ParseURL(raw string) (*URL, error) {
	if len(raw) > MaxURLLength {
		return nil, fmt.Errorf("upstream: URL of %d bytes, more than %d", len(raw), MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	switch {
	case u.Scheme == "" || u.Host == "":
		return nil, fmt.Errorf("upstream: %q: want SCHEME://HOST:PORT?OPTIONS", raw)
	case u.User != nil:
		return nil, errors.New("upstream: the URL may not hold credentials: use --upstream-credentials")
	case u.Path != "" && u.Path != "/", u.Fragment != "":
		return nil, fmt.Errorf("upstream: %q: no path or fragment allowed", raw)
	case u.Port() == "":
		return nil, fmt.Errorf("upstream: %q: the port is required", raw)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("upstream: query: %w", err)
	}
	for k, v := range q {
		if len(v) != 1 {
			return nil, fmt.Errorf("upstream: option %q given %d times", k, len(v))
		}
	}
	return &URL{Scheme: strings.ToLower(u.Scheme), Host: u.Host, Query: q}, nil
}

// MaxCredentialsSize bounds the --upstream-credentials file.
const MaxCredentialsSize = 4096

// ReadHexKey reads an HMAC key written in hex (cfssl's auth_keys format)
// from path: a regular file (a symbolic link is followed, as in a mounted
// Secret) that others may not access and the group may at most read (a
// Secret volume is made group-readable for the pod's fsGroup), at most
// MaxCredentialsSize bytes, of at least minBytes once decoded. Errors name
// the file, never its contents.
func ReadHexKey(path string, minBytes int) ([]byte, error) {
	data, err := ReadSecretFile(path)
	if err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, fmt.Errorf("upstream credentials: %s: not a key in hex", path) // the decoder's error would quote the key
	}
	if len(key) < minBytes {
		return nil, fmt.Errorf("upstream credentials: %s: a key of %d bytes, want at least %d", path, len(key), minBytes)
	}
	return key, nil
}
