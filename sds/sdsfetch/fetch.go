package sdsfetch

import (
	"cmp"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/envoysecret"
)

// TypeURL is the xDS type of SDS secrets.
const TypeURL = envoysecret.TypeURL

// DefaultNames are the resources a proxy asks an Istio-style agent for.
var DefaultNames = []string{"default", "ROOTCA"}

// DefaultTimeout bounds a fetch when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Config says where and what to fetch.
type Config struct {
	Socket  string        // path of the SDS Unix socket
	Names   []string      // resource names; empty means DefaultNames
	Timeout time.Duration // for the whole fetch; 0 means DefaultTimeout
	NodeID  string        // node.id sent with the first request; "" means "meshid-inspect"
	Logger  *slog.Logger  // nil discards
}

// Kind is the kind of secret received.
type Kind = envoysecret.Kind

// Secret kinds.
const (
	KindTLSCertificate    = envoysecret.KindTLSCertificate
	KindValidationContext = envoysecret.KindValidationContext
	KindOther             = envoysecret.KindOther // session ticket keys, generic secrets
)

// Secret is one SDS resource, parsed.
type Secret struct {
	Name    string
	Version string // version_info of the response that carried it
	Kind    Kind
	Chain   []*x509.Certificate // tls_certificate.certificate_chain, leaf first
	Key     crypto.Signer       // tls_certificate.private_key; nil when not sent inline
	Roots   []*x509.Certificate // validation_context.trusted_ca and SPIFFE validator bundles
}

// Fetch connects to cfg.Socket and returns the secrets in the order of
// cfg.Names. Every error is one line that names the socket and, where it
// applies, the resource.
func Fetch(ctx context.Context, cfg Config) ([]*Secret, error) {
	if cfg.Socket == "" {
		return nil, errors.New("sdsfetch: no socket given")
	}
	names := cfg.Names
	if len(names) == 0 {
		names = DefaultNames
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	node := cfg.NodeID
	node = cmp.Or(node, "meshid-inspect")
	log := logs.OrDiscard(cfg.Logger)
	sock := cfg.Socket
	fail := func(format string, args ...any) error {
		return fmt.Errorf("sdsfetch: %s: %s", sock, fmt.Sprintf(format, args...))
	}
	st, err := os.Stat(sock)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fail("no such socket")
	case err != nil:
		return nil, fail("%v", unwrapPath(err))
	case st.Mode()&fs.ModeSocket == 0:
		return nil, fail("not a Unix socket")
	}

	// The dialer takes the path as given: a relative path such as Istio's
	// ./var/run/secrets/workload-spiffe-uds/socket may be too long for
	// sun_path once made absolute.
	conn, err := grpc.NewClient("passthrough:///sds",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		return nil, fail("%v", err)
	}
	defer conn.Close()
	client := secretv3.NewSecretDiscoveryServiceClient(conn)

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	f := fetcher{client: client, node: &corev3.Node{Id: node, Cluster: "meshid-inspect"}, log: log}

	out := make([]*Secret, len(names))
	g, gctx := errgroup.WithContext(ctx)
	for i, name := range names {
		g.Go(func() error {
			s, err := f.stream(gctx, name)
			out[i] = s
			return err
		})
		g.Go(func() error { return f.probe(gctx, name) })
	}
	err = g.Wait()
	if status.Code(err) == codes.Unimplemented {
		log.Debug("StreamSecrets unimplemented; trying FetchSecrets", logs.KeySocket, sock)
		out, err = f.fetch(ctx, names)
	}
	if err != nil {
		return nil, explain(sock, timeout, err)
	}
	return out, nil
}

// resourceError ties an error to the resource it concerns.
type resourceError struct {
	name string
	err  error
}

func (e *resourceError) Error() string { return fmt.Sprintf("resource %q: %v", e.name, e.err) }
func (e *resourceError) Unwrap() error { return e.err }

type fetcher struct {
	client secretv3.SecretDiscoveryServiceClient
	node   *corev3.Node
	log    *slog.Logger
}

// stream asks for one name on its own StreamSecrets stream, as Envoy and
// istio-agent's older servers expect, and ACKs the response that holds it.
func (f fetcher) stream(ctx context.Context, name string) (*Secret, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	st, err := f.client.StreamSecrets(ctx)
	if err != nil {
		return nil, &resourceError{name, err}
	}
	req := &discoveryv3.DiscoveryRequest{Node: f.node, ResourceNames: []string{name}, TypeUrl: TypeURL}
	if err := st.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, &resourceError{name, err}
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return nil, &resourceError{name, err}
		}
		secrets, perr := parseResponse(resp)
		ack := &discoveryv3.DiscoveryRequest{ResourceNames: []string{name}, TypeUrl: TypeURL, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if perr != nil {
			ack.VersionInfo = ""
			ack.ErrorDetail = status.New(codes.InvalidArgument, perr.Error()).Proto()
		}
		if err := st.Send(ack); err != nil && !errors.Is(err, io.EOF) {
			f.log.Debug("SDS ACK failed", logs.KeyResource, name, logs.KeyError, err)
		}
		if perr != nil {
			var re *resourceError
			if errors.As(perr, &re) {
				return nil, perr
			}
			return nil, &resourceError{name, perr}
		}
		for _, s := range secrets {
			if s.Name == name {
				closeStream(ctx, st)
				return s, nil
			}
		}
		f.log.Debug("SDS response without the resource asked for; waiting", logs.KeyResource, name)
	}
}

// closeGrace bounds how long a fetch waits for the server to end a stream
// it has half-closed.
const closeGrace = time.Second

// closeStream half-closes st and waits, at most closeGrace, for the server
// to end it, as SotW servers do when the client is done (meshid's agent,
// go-control-plane's). Cancelling at once instead could make the server
// drop the ACK just sent: gRPC may hand its handler the cancellation before
// the message (TestFetch counted 0 of 3 ACKs once under load).
func closeStream(ctx context.Context, st grpc.ClientStream) {
	if err := st.CloseSend(); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, closeGrace)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st.RecvMsg(new(discoveryv3.DiscoveryResponse)) == nil {
		}
	}()
	select {
	case <-done:
	case <-ctx.Done(): // the caller's cancel ends the stream and the loop
	}
}

// probe asks for name with the unary FetchSecrets alongside its stream. A
// SotW stream never answers a name the server does not know (a proxy just
// waits), but FetchSecrets does at once (meshid's agent: NotFound with the
// reason, such as a relative file-cert: path): that answer ends the fetch
// instead of the timeout. Any other outcome (the secret, Unimplemented on
// servers without FetchSecrets, ...) leaves the stream to decide.
func (f fetcher) probe(ctx context.Context, name string) error {
	_, err := f.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{Node: f.node, ResourceNames: []string{name}, TypeUrl: TypeURL})
	switch status.Code(err) {
	case codes.NotFound, codes.InvalidArgument:
		return &resourceError{name, err}
	}
	return nil
}

// fetch uses the unary FetchSecrets for servers without streaming.
func (f fetcher) fetch(ctx context.Context, names []string) ([]*Secret, error) {
	resp, err := f.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{Node: f.node, ResourceNames: names, TypeUrl: TypeURL})
	if err != nil {
		return nil, err
	}
	secrets, err := parseResponse(resp)
	if err != nil {
		return nil, err
	}
	out := make([]*Secret, len(names))
	for i, name := range names {
		for _, s := range secrets {
			if s.Name == name {
				out[i] = s
			}
		}
		if out[i] == nil {
			return nil, &resourceError{name, errors.New("not in the FetchSecrets response (unknown resource name?)")}
		}
	}
	return out, nil
}

func parseResponse(resp *discoveryv3.DiscoveryResponse) ([]*Secret, error) {
	var out []*Secret
	for _, res := range resp.GetResources() {
		if res.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("unexpected resource type %q", res.GetTypeUrl())
		}
		var sec tlsv3.Secret
		if err := res.UnmarshalTo(&sec); err != nil {
			return nil, fmt.Errorf("malformed Secret: %v", err)
		}
		s, err := parseSecret(&sec)
		if err != nil {
			return nil, &resourceError{sec.GetName(), err}
		}
		s.Version = resp.GetVersionInfo()
		out = append(out, s)
	}
	return out, nil
}

// ErrNotSDS is wrapped by Fetch's error when the socket's gRPC server does
// not implement SDS.
var ErrNotSDS = errors.New("not an SDS server")

// explain turns a fetch error into one line for an operator.
func explain(sock string, timeout time.Duration, err error) error {
	prefix := "sdsfetch: " + sock + ": "
	name, inner := "", err
	var re *resourceError
	if errors.As(err, &re) {
		name, inner = re.name, re.err
	}
	st, ok := status.FromError(inner)
	if !ok {
		return fmt.Errorf("%s%v", prefix, err) // a parse error; it names the resource
	}
	switch st.Code() {
	case codes.Unimplemented:
		return fmt.Errorf("%s%w (%s)", prefix, ErrNotSDS, st.Message())
	case codes.Unavailable:
		return fmt.Errorf("%snot an SDS server, or not answering (%s)", prefix, st.Message())
	case codes.DeadlineExceeded:
		if name != "" {
			return fmt.Errorf("%sno answer for resource %q within %s (unknown resource name, or not an SDS server?)", prefix, name, timeout)
		}
		return fmt.Errorf("%sno answer within %s", prefix, timeout)
	case codes.Canceled:
		return fmt.Errorf("%scanceled", prefix)
	}
	if name != "" {
		return fmt.Errorf("%sresource %q: %s: %s", prefix, name, st.Code(), st.Message())
	}
	return fmt.Errorf("%s%s: %s", prefix, st.Code(), st.Message())
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
