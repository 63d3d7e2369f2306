package cfssl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cloudflare/cfssl/api/client"
	"github.com/cloudflare/cfssl/auth"

	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
)

// Scheme is the --upstream scheme of this backend.
const Scheme = "cfssl+https"

// Limits.
const (
	// MinKeyBytes is the shortest HMAC key accepted (cfssl's own
	// examples use 16 bytes).
	MinKeyBytes = 16
	// DefaultTimeout bounds one request to cfssl.
	DefaultTimeout = 30 * time.Second
)

// Config configures a Client.
type Config struct {
	// URL is the parsed --upstream: scheme cfssl+https; options profile
	// (required: a CA profile of cfssl's signing config, with an
	// auth_key), ca (PEM roots that verify cfssl's TLS certificate;
	// default the system's) and roots (PEM roots of the upstream, needed
	// only when cfssl's own CA certificate is not self-signed).
	URL *upstream.URL
	// CredentialsFile holds the profile's HMAC key in hex
	// (upstream.ReadHexKey's rules). Required.
	CredentialsFile string
	// Timeout bounds one request; 0 is DefaultTimeout.
	Timeout time.Duration
}

// Client is the cfssl upstream.
type Client struct {
	remote  client.Remote
	auth    auth.Provider
	profile string
	roots   []*x509.Certificate // from roots=, nil to use cfssl's own certificate
}

// New checks cfg, reads its files and returns a Client. It does not
// contact cfssl.
func New(cfg Config) (*Client, error) {
	u := cfg.URL
	if u == nil || u.Scheme != Scheme {
		return nil, fmt.Errorf("cfssl: want a %s:// URL", Scheme)
	}
	for k := range u.Query {
		switch k {
		case "profile", "ca", "roots":
		default:
			return nil, fmt.Errorf("cfssl: unknown option %q (want profile, ca, roots)", k)
		}
	}
	c := &Client{profile: u.Query.Get("profile")}
	if c.profile == "" {
		return nil, errors.New("cfssl: the profile option is required (a CA profile of cfssl's signing config)")
	}
	if cfg.CredentialsFile == "" {
		return nil, errors.New("cfssl: --upstream-credentials is required (the profile's auth key in hex)")
	}
	key, err := upstream.ReadHexKey(cfg.CredentialsFile, MinKeyBytes)
	if err != nil {
		return nil, err
	}
	// auth.New takes the key in hex; a hex string never holds the "file:"
	// or "env:" prefixes it would otherwise follow.
	if c.auth, err = auth.New(fmt.Sprintf("%x", key), nil); err != nil {
		return nil, fmt.Errorf("cfssl: auth key: %w", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if p := u.Query.Get("ca"); p != "" {
		cas, err := upstream.ReadPEMCerts(p)
		if err != nil {
			return nil, fmt.Errorf("cfssl: ca=%s: %w", p, err)
		}
		tc.RootCAs = x509.NewCertPool()
		for _, c := range cas {
			tc.RootCAs.AddCert(c)
		}
	}
	if p := u.Query.Get("roots"); p != "" {
		if c.roots, err = upstream.ReadPEMCerts(p); err != nil {
			return nil, fmt.Errorf("cfssl: roots=%s: %w", p, err)
		}
	}
	c.remote = client.NewServerTLS("https://"+u.Host, tc)
	if c.remote == nil {
		return nil, fmt.Errorf("cfssl: bad address %q", u.Host)
	}
	c.remote.SetRequestTimeout(cmpOr(cfg.Timeout, DefaultTimeout))
	return c, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// MintX509CA has cfssl sign csr with the profile. cfssl's profile expiry
// sets the lifetime: ttl is not sent (cfssl's API has no field for it).
// The roots are cfssl's CA certificate (its info endpoint) when it is
// self-signed, else the roots= file, with cfssl's certificate in the chain.
func (c *Client) MintX509CA(ctx context.Context, csr []byte, _ time.Duration) (*upstream.Minted, error) {
	req, err := json.Marshal(map[string]string{
		"certificate_request": string(certs.EncodeCSR(csr)),
		"profile":             c.profile,
	})
	if err != nil {
		return nil, err
	}
	signed, err := call(ctx, func() ([]byte, error) { return c.remote.AuthSign(req, nil, c.auth) })
	if err != nil {
		return nil, fmt.Errorf("cfssl authsign (profile %q): %w", c.profile, err)
	}
	chain, err := upstream.ParseCerts(signed)
	if err != nil {
		return nil, fmt.Errorf("cfssl authsign: %w", err)
	}
	roots, between, err := c.issuerRoots(ctx)
	if err != nil {
		return nil, err
	}
	return &upstream.Minted{Chain: append(chain[:1], between...), Roots: roots}, nil
}

// FetchRoots returns the roots MintX509CA would return now (its info
// endpoint needs no key).
func (c *Client) FetchRoots(ctx context.Context) ([]*x509.Certificate, error) {
	roots, _, err := c.issuerRoots(ctx)
	return roots, err
}

// issuerRoots splits cfssl's CA certificate for the profile (its info
// endpoint): the roots are that certificate when it is self-signed, else
// the roots= file, with cfssl's certificate between it and the new
// intermediate.
func (c *Client) issuerRoots(ctx context.Context) (roots, between []*x509.Certificate, err error) {
	issuer, err := c.issuer(ctx)
	if err != nil {
		return nil, nil, err
	}
	roots = c.roots
	for _, is := range issuer {
		switch {
		case !upstream.SelfSigned(is):
			between = append(between, is)
		case c.roots == nil:
			roots = append(roots, is)
		}
	}
	if len(roots) == 0 {
		return nil, nil, errors.New("cfssl: cfssl's CA certificate is not self-signed: give its roots with the roots= option")
	}
	return roots, between, nil
}

// issuer is cfssl's CA certificate for the profile (its info endpoint).
func (c *Client) issuer(ctx context.Context) ([]*x509.Certificate, error) {
	infoReq, _ := json.Marshal(map[string]string{"profile": c.profile})
	issuerPEM, err := call(ctx, func() ([]byte, error) {
		r, err := c.remote.Info(infoReq)
		if err != nil {
			return nil, err
		}
		return []byte(r.Certificate), nil
	})
	if err != nil {
		return nil, fmt.Errorf("cfssl info (profile %q): %w", c.profile, err)
	}
	issuer, err := upstream.ParseCerts(issuerPEM)
	if err != nil {
		return nil, fmt.Errorf("cfssl info: %w", err)
	}
	return issuer, nil
}

// call runs f, a blocking cfssl client call bounded by its own timeout,
// until ctx ends; a panic of the client on a malformed answer (it asserts
// JSON types) is an error.
func call(ctx context.Context, f func() ([]byte, error)) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				ch <- result{err: fmt.Errorf("malformed answer: %v", p)}
			}
		}()
		b, err := f()
		ch <- result{b, err}
	}()
	select {
	case r := <-ch:
		return r.b, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
