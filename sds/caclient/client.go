package caclient

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
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
)

// DefaultTimeout bounds one CreateCertificate call.
const DefaultTimeout = 30 * time.Second

// maxTokenSize guards against reading a huge file as a token.
const maxTokenSize = 64 << 10

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
	// ClusterID, when set, is sent as "ClusterID" in the request metadata.
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
	conn      *grpc.ClientConn
	api       pb.IstioCertificateServiceClient
	tokenFile string
	meta      *structpb.Struct
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
	pool := x509.NewCertPool()
	for _, r := range cfg.Roots {
		pool.AddCert(r)
	}
	serverName := cfg.ServerName
	if serverName == "" {
		serverName = identity.CAServerName(cfg.Addr)
	}
	creds := credentials.NewTLS(&tls.Config{
		RootCAs:    pool,
		ServerName: serverName,
		MinVersion: tls.VersionTLS12,
	})
	c := &Client{
		tokenFile: cfg.TokenFile,
		timeout:   cfg.Timeout,
		clock:     clock.OrReal(cfg.Clock),
		log:       cfg.Logger,
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c.log = c.log.With("component", "caclient", "ca_addr", cfg.Addr)
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
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithUserAgent("meshid-agent")}, cfg.DialOptions...)
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

// Sign sends the PEM CSR and returns the certificate chain (leaf first, then
// intermediates) and the root bundle. ttl is sent as validity_duration in
// seconds (0 lets the CA choose). Errors from the CA keep their gRPC code.
func (c *Client) Sign(ctx context.Context, csrPEM []byte, ttl time.Duration) (chain, roots []*x509.Certificate, err error) {
	start := c.clock.Now()
	defer func() {
		c.metrics.duration.Observe(c.clock.Now().Sub(start).Seconds())
		if err != nil {
			c.metrics.failure(err)
			c.log.Debug("CreateCertificate failed", "code", failureCode(err), "error", err)
		}
	}()
	csr, err := parseCSR(csrPEM)
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
		Csr:              string(csrPEM),
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
	if err := verify(chain, roots, csr, c.clock.Now()); err != nil {
		return nil, nil, err
	}
	c.log.Debug("certificate issued", "serial", chain[0].SerialNumber.Text(16), "not_after", chain[0].NotAfter.UTC())
	return chain, roots, nil
}

// readToken returns the trimmed token. Errors name the file, never the
// content.
func (c *Client) readToken() (string, error) {
	f, err := os.Open(c.tokenFile)
	if err != nil {
		return "", &tokenError{fmt.Errorf("caclient: token file: %w", err)}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenSize+1))
	if err != nil {
		return "", &tokenError{fmt.Errorf("caclient: token file %s: %w", c.tokenFile, err)}
	}
	if len(b) > maxTokenSize {
		return "", &tokenError{fmt.Errorf("caclient: token file %s is larger than %d bytes", c.tokenFile, maxTokenSize)}
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

// failureCode labels an error for metrics: the gRPC code, or the
// FailureCode of a local failure.
func failureCode(err error) string {
	var fc interface{ FailureCode() string }
	if errors.As(err, &fc) {
		return fc.FailureCode()
	}
	return status.Code(err).String()
}

func parseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != certs.BlockCSR {
		return nil, errors.New("caclient: the CSR is not a PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("caclient: parse CSR: %w", err)
	}
	return csr, nil
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

// verify checks that the leaf certifies the CSR's key and SPIFFE ID and that
// the chain verifies to roots at now.
func verify(chain, roots []*x509.Certificate, csr *x509.CertificateRequest, now time.Time) error {
	leaf := chain[0]
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if k, ok := csr.PublicKey.(equaler); !ok || !k.Equal(leaf.PublicKey) {
		return invalid("the leaf does not certify the CSR's public key")
	}
	if len(csr.URIs) > 0 {
		want, err := spiffeid.FromURI(csr.URIs[0])
		if err != nil || len(csr.URIs) != 1 {
			return fmt.Errorf("caclient: the CSR does not carry exactly one SPIFFE ID")
		}
		got, err := x509svid.IDFromCert(leaf)
		if err != nil {
			return invalid("leaf: %v", err)
		}
		if got != want {
			return invalid("leaf identity %s, want %s", got, want)
		}
	}
	rootPool := x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         rootPool,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return invalid("the chain does not verify to the returned roots: %v", err)
	}
	return nil
}
