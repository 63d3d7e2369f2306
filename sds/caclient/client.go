package caclient

import (
	"cmp"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// DefaultTimeout bounds one CreateCertificate call.
const DefaultTimeout = 30 * time.Second

// ErrInvalidResponse is wrapped by every error about an answer the client
// refused (malformed chain, wrong key or identity, chain that does not
// verify).
var ErrInvalidResponse = errors.New("caclient: invalid CA response")

// Config configures a Client.
type Config struct {
	// Addr is the CA's host:port. Required.
	Addr string
	// Roots verify the CA's serving certificate. Required: the client never
	// talks to a CA it cannot verify.
	Roots []*x509.Certificate
	// ServerName is the name verified in the serving certificate. Empty
	// means identity.CAServerName(Addr).
	ServerName string
	// TokenFile holds the service-account token sent as a bearer token. It
	// is re-read for every request. Required.
	TokenFile string
	// ClusterID, when set, is sent as "ClusterID" in the request metadata
	// (CreateCertificate) or as a gRPC header (MintJWTSVID).
	ClusterID string
	// Timeout bounds each request (a network deadline, in real time); 0
	// means 30s.
	Timeout time.Duration

	// DialOptions are appended to the client's own gRPC dial options (for
	// example keepalive parameters, or WaitForReady in tests).
	DialOptions []grpc.DialOption

	Clock      clock.Clock           // for verification time and latency
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// Client calls CreateCertificate. It is safe for concurrent use.
type Client struct {
	roots     *rootPool // verify the CA; SetRoots replaces them
	conn      *grpc.ClientConn
	api       pb.IstioCertificateServiceClient
	tokenFile string
	meta      *structpb.Struct
	clusterID string // also sent as the ClusterID header of JWT-SVID requests
	timeout   time.Duration
	clock     clock.Clock
	log       *slog.Logger
	metrics   *metrics
}

// New validates cfg and returns a Client. No connection is made until the
// first Sign.
func New(cfg Config) (*Client, error) {
	if cfg.Addr == "" {
		return nil, errors.New("caclient: Config.Addr is required")
	}
	if len(cfg.Roots) == 0 {
		return nil, errors.New("caclient: Config.Roots is required to verify the CA")
	}
	if cfg.TokenFile == "" {
		return nil, errors.New("caclient: Config.TokenFile is required")
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("caclient: Config.Timeout must not be negative")
	}
	serverName := cfg.ServerName
	if serverName == "" {
		serverName = identity.CAServerName(cfg.Addr)
	}
	c := &Client{
		roots:     &rootPool{},
		tokenFile: cfg.TokenFile,
		clusterID: cfg.ClusterID,
		timeout:   cfg.Timeout,
		clock:     clock.OrReal(cfg.Clock),
		log:       cfg.Logger,
	}
	c.SetRoots(cfg.Roots)
	creds := credentials.NewTLS(c.tlsConfig(serverName))
	c.timeout = cmp.Or(c.timeout, DefaultTimeout)
	c.log = logs.OrDiscard(c.log)
	c.log = c.log.With(logs.KeyComponent, "caclient", logs.KeyCAAddr, cfg.Addr)
	if cfg.ClusterID != "" {
		c.meta = &structpb.Struct{Fields: map[string]*structpb.Value{"ClusterID": structpb.NewStringValue(cfg.ClusterID)}}
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c.metrics = met
	// grpc.NewClient does not connect; the channel dials on first use and
	// reconnects on its own after a CA restart.
	//
	// Service config from DNS is off. gRPC's DNS resolver otherwise asks for
	// a TXT record (_grpc_config.<host>) before it hands over any address,
	// so an agent whose DNS server does not answer waits out the resolver's
	// timeouts (5 s, twice) before its first CSR even when the CA's name is
	// in /etc/hosts; and whoever answers that TXT record could change the
	// connection's load balancing and retries. The agent's connection policy
	// is this code's, not DNS's. TestNoServiceConfigFromDNS holds it.
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("meshid-agent"),
		grpc.WithDisableServiceConfig(),
	}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("caclient: %w", err)
	}
	c.conn = conn
	c.api = pb.NewIstioCertificateServiceClient(conn)
	return c, nil
}

// Close closes the connection to the CA.
func (c *Client) Close() error { return c.conn.Close() }

// Sign sends the CSR (PEM-encoded only on the wire) and returns the
// certificate chain (leaf first, then intermediates) and the root bundle,
// checked with Verify against the CSR's key and SPIFFE ID. ttl is sent as
// validity_duration in seconds (0 lets the CA choose). Errors from the CA
// keep their gRPC code; a refused answer wraps ErrInvalidResponse.
func (c *Client) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) (chain, roots []*x509.Certificate, err error) {
	start := c.clock.Now()
	defer func() {
		c.metrics.duration.Observe(c.clock.Now().Sub(start).Seconds())
		if err != nil {
			c.metrics.failure(err)
			c.log.Debug("CreateCertificate failed", logs.KeyCode, FailureCode(err), logs.KeyError, err)
		}
	}()
	id, err := csrID(csr)
	if err != nil {
		return nil, nil, err
	}
	token, err := c.readToken()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	resp, err := c.api.CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr:              string(certs.EncodeCSR(csr.Raw)),
		ValidityDuration: int64(ttl / time.Second),
		Metadata:         c.meta,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("caclient: CreateCertificate: %w", err)
	}
	chain, roots, err = parseChain(resp.GetCertChain())
	if err != nil {
		return nil, nil, err
	}
	if err := Verify(chain, roots, csr.PublicKey, id, c.clock.Now()); err != nil {
		return nil, nil, err
	}
	c.log.Debug("certificate issued", logs.KeySerial, chain[0].SerialNumber.Text(16), logs.KeyNotAfter, chain[0].NotAfter.UTC())
	return chain, roots, nil
}

// csrID returns the one SPIFFE ID the CSR asks for.
func csrID(csr *x509.CertificateRequest) (spiffeid.ID, error) {
	if csr == nil {
		return spiffeid.ID{}, errors.New("caclient: no CSR")
	}
	id, err := x509svid.IDFromCert(&x509.Certificate{URIs: csr.URIs})
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("caclient: the CSR does not carry exactly one SPIFFE ID: %w", err)
	}
	return id, nil
}

// readToken returns the trimmed token. Errors name the file, never the
// content.
func (c *Client) readToken() (string, error) {
	f, err := os.Open(c.tokenFile)
	if err != nil {
		return "", &tokenError{fmt.Errorf("caclient: token file: %w", err)}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, identity.MaxTokenSize+1))
	if err != nil {
		return "", &tokenError{fmt.Errorf("caclient: token file %s: %w", c.tokenFile, err)}
	}
	if len(b) > identity.MaxTokenSize {
		return "", &tokenError{fmt.Errorf("caclient: token file %s is larger than %d bytes", c.tokenFile, identity.MaxTokenSize)}
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", &tokenError{fmt.Errorf("caclient: token file %s is empty", c.tokenFile)}
	}
	return tok, nil
}

// tokenError is a failure to read the token file.
type tokenError struct{ err error }

func (e *tokenError) Error() string       { return e.err.Error() }
func (e *tokenError) Unwrap() error       { return e.err }
func (e *tokenError) FailureCode() string { return "token_file" }

// responseError is an answer the client refused.
type responseError struct{ msg string }

func (e *responseError) Error() string        { return ErrInvalidResponse.Error() + ": " + e.msg }
func (e *responseError) Is(target error) bool { return target == ErrInvalidResponse }
func (e *responseError) FailureCode() string  { return "invalid_response" }

func invalid(format string, args ...any) error {
	return &responseError{msg: fmt.Sprintf(format, args...)}
}

// FailureCode labels a failed attempt to get a certificate, for logs and
// metrics: "invalid_response" for answers refused by Verify, the FailureCode
// of another local failure ("token_file"), else the gRPC code.
func FailureCode(err error) string {
	var fc interface{ FailureCode() string }
	if errors.As(err, &fc) {
		return fc.FailureCode()
	}
	return status.Code(err).String()
}

// parseChain splits cert_chain: the last element is the root bundle (one or
// more certificates), the elements before it the leaf and intermediates.
func parseChain(elems []string) (chain, roots []*x509.Certificate, err error) {
	if len(elems) < 2 {
		return nil, nil, invalid("cert_chain has %d elements, want the leaf and the roots at least", len(elems))
	}
	for i, e := range elems[:len(elems)-1] {
		cs, err := certs.ParseCertificates([]byte(e))
		if err != nil {
			return nil, nil, invalid("cert_chain[%d]: %v", i, err)
		}
		chain = append(chain, cs...)
	}
	roots, err = certs.ParseCertificates([]byte(elems[len(elems)-1]))
	if err != nil {
		return nil, nil, invalid("root bundle: %v", err)
	}
	return chain, roots, nil
}

// Verify checks a CA's answer to a CSR for key pub and SPIFFE ID id: a
// leaf (chain[0]) that certifies pub, is an X509-SVID for exactly id, and
// verifies through chain[1:] to roots at now. Every refusal wraps
// ErrInvalidResponse. It is the agent's one check of a CA's answer.
func Verify(chain, roots []*x509.Certificate, pub crypto.PublicKey, id spiffeid.ID, now time.Time) error {
	switch {
	case len(chain) == 0:
		return invalid("no certificate")
	case len(roots) == 0:
		return invalid("no roots")
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if k, ok := pub.(equaler); !ok || !k.Equal(chain[0].PublicKey) {
		return invalid("the leaf does not certify the CSR's public key")
	}
	got, err := certs.VerifySVID(chain, id.TrustDomain(), roots, now)
	if err != nil {
		return invalid("the answer is not an X509-SVID chained to the returned roots: %v", err)
	}
	if got != id {
		return invalid("leaf identity %s, want %s", got, id)
	}
	return nil
}
