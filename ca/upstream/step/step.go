package step

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// Scheme is the --upstream scheme of this backend.
const Scheme = "step+https"

// Limits.
const (
	// MaxResponse bounds the body of one step-ca answer.
	MaxResponse = 256 << 10
	// MaxErrorMessage bounds the part of step-ca's error message an error
	// quotes.
	MaxErrorMessage = 512
	// DefaultTimeout bounds one request to step-ca.
	DefaultTimeout = 30 * time.Second
	// TokenLifetime is how long a one-time token is valid (step's CLI
	// gives 5 minutes too); step-ca allows a minute of clock skew.
	TokenLifetime = 5 * time.Minute
)

// Config configures a Client.
type Config struct {
	// URL is the parsed --upstream: scheme step+https; options
	// provisioner (required: the name of a JWK provisioner of step-ca
	// whose options.x509.template issues CA certificates) and ca (PEM
	// roots that verify step-ca's TLS certificate, usually step-ca's
	// root_ca.crt; default the system's).
	URL *upstream.URL
	// CredentialsFile holds the provisioner's private key as a plain JSON
	// Web Key (upstream.ReadSecretFile's rules). Required.
	CredentialsFile string
	// Timeout bounds one request; 0 is DefaultTimeout.
	Timeout time.Duration
	// Clock dates the one-time tokens; nil is the real clock. step-ca
	// checks them against its own clock, so only a test whose step-ca
	// is a fake sets it.
	Clock clock.Clock
}

// Client is the step-ca upstream.
type Client struct {
	base        string // https://HOST:PORT
	audience    string // https://HOST:PORT/1.0/sign
	provisioner string
	key         *provisionerKey
	http        *http.Client
	clock       clock.Clock
}

// New checks cfg, reads its files and returns a Client. It does not
// contact step-ca.
func New(cfg Config) (*Client, error) {
	u := cfg.URL
	if u == nil || u.Scheme != Scheme {
		return nil, fmt.Errorf("step-ca: want a %s:// URL", Scheme)
	}
	for k := range u.Query {
		switch k {
		case "provisioner", "ca":
		default:
			return nil, fmt.Errorf("step-ca: unknown option %q (want provisioner, ca)", k)
		}
	}
	c := &Client{
		base:        "https://" + u.Host,
		audience:    "https://" + u.Host + "/1.0/sign",
		provisioner: u.Query.Get("provisioner"),
		clock:       clock.OrReal(cfg.Clock),
	}
	if c.provisioner == "" {
		return nil, errors.New("step-ca: the provisioner option is required (a JWK provisioner of step-ca with an intermediate template)")
	}
	if cfg.CredentialsFile == "" {
		return nil, errors.New("step-ca: --upstream-credentials is required (the JWK provisioner's private key)")
	}
	var err error
	if c.key, err = readProvisionerKey(cfg.CredentialsFile); err != nil {
		return nil, err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if p := u.Query.Get("ca"); p != "" {
		cas, err := upstream.ReadPEMCerts(p)
		if err != nil {
			return nil, fmt.Errorf("step-ca: ca=%s: %w", p, err)
		}
		tc.RootCAs = x509.NewCertPool()
		for _, c := range cas {
			tc.RootCAs.AddCert(c)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	c.http = &http.Client{
		Transport: tr,
		Timeout:   cmpOr(cfg.Timeout, DefaultTimeout),
		// A redirect would carry the token (a POST body is sent again
		// on 307 and 308) to where step-ca's answer points.
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("step-ca answered with a redirect: refused")
		},
	}
	return c, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// MintX509CA has step-ca sign csr through the JWK provisioner: the roots
// from /1.0/roots, then a one-time token for the CSR's names and POST
// /1.0/sign asking for ttl (the provisioner's maxTLSCertDuration bounds
// it; step-ca refuses more). The provisioner's template makes the answer
// a CA certificate; upstream.Check judges it.
func (c *Client) MintX509CA(ctx context.Context, csr []byte, ttl time.Duration) (*upstream.Minted, error) {
	req, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		return nil, fmt.Errorf("step-ca: CSR: %w", err)
	}
	roots, err := c.FetchRoots(ctx)
	if err != nil {
		return nil, err
	}
	fp := sha256.Sum256(roots[0].Raw)
	ott, err := c.key.token(c.provisioner, c.audience, hex.EncodeToString(fp[:]), req, c.clock.Now())
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(signRequest{CSR: string(certs.EncodeCSR(csr)), OTT: ott, NotAfter: ttl.String()})
	var resp signResponse
	if err := c.do(ctx, http.MethodPost, "/1.0/sign", body, &resp); err != nil {
		return nil, fmt.Errorf("step-ca sign (provisioner %q): %w", c.provisioner, err)
	}
	leaf, err := upstream.ParseCerts([]byte(resp.Crt))
	if err != nil {
		return nil, fmt.Errorf("step-ca sign: crt: %w", err)
	}
	pems := resp.CertChain
	if len(pems) == 0 {
		pems = []string{resp.Crt, resp.CA}
	}
	if len(pems) > upstream.MaxCerts {
		return nil, fmt.Errorf("step-ca sign: %d certificates in the chain, more than %d", len(pems), upstream.MaxCerts)
	}
	m := &upstream.Minted{Chain: leaf[:1], Roots: roots}
	for _, p := range pems[1:] {
		cs, err := upstream.ParseCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("step-ca sign: certChain: %w", err)
		}
		for _, is := range cs {
			if !upstream.SelfSigned(is) { // a root in the chain is not sent on
				m.Chain = append(m.Chain, is)
			}
		}
	}
	return m, nil
}

type signRequest struct {
	CSR      string `json:"csr"`
	OTT      string `json:"ott"`
	NotAfter string `json:"notAfter,omitempty"`
}

type signResponse struct {
	Crt       string   `json:"crt"`
	CA        string   `json:"ca"`
	CertChain []string `json:"certChain"`
}

// FetchRoots returns step-ca's roots (/1.0/roots, which needs no token),
// the trust bundle.
func (c *Client) FetchRoots(ctx context.Context) ([]*x509.Certificate, error) {
	var resp struct {
		Crts []string `json:"crts"`
	}
	if err := c.do(ctx, http.MethodGet, "/1.0/roots", nil, &resp); err != nil {
		return nil, fmt.Errorf("step-ca roots: %w", err)
	}
	if len(resp.Crts) == 0 || len(resp.Crts) > upstream.MaxCerts {
		return nil, fmt.Errorf("step-ca roots: %d roots, want 1 to %d", len(resp.Crts), upstream.MaxCerts)
	}
	var roots []*x509.Certificate
	for _, p := range resp.Crts {
		cs, err := upstream.ParseCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("step-ca roots: %w", err)
		}
		roots = append(roots, cs...)
	}
	return roots, nil
}

// do sends one request and decodes a 2xx JSON answer into out; another
// status is an error quoting step-ca's message (bounded).
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		return err
	}
	if len(data) > MaxResponse {
		return fmt.Errorf("an answer of more than %d bytes", MaxResponse)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(data, &e)
		msg := strings.ToValidUTF8(e.Message, "?")
		if len(msg) > MaxErrorMessage {
			msg = msg[:MaxErrorMessage] + "…"
		}
		return fmt.Errorf("HTTP %d: %q", resp.StatusCode, msg)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("malformed answer: %w", err)
	}
	return nil
}
