package workloadendpoint

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/secretcache"
)

// FetchX509SVID streams the workload's X.509-SVID (chain, PKCS#8 key, trust
// bundle): once available, then again after every rotation and every
// bundle change.
func (s *Server) FetchX509SVID(_ *workloadpb.X509SVIDRequest, stream grpc.ServerStreamingServer[workloadpb.X509SVIDResponse]) error {
	return serve(s, stream.Context(), []string{secretcache.DefaultName, secretcache.FederatedRootName}, s.svidResponse,
		func(r *encoded) error {
			if err := stream.Send(r.svid); err != nil {
				return err
			}
			s.metrics.pushes.WithLabelValues("FetchX509SVID").Inc()
			return nil
		})
}

// FetchX509Bundles streams the trust bundles by trust domain: once
// available, then again after every change.
func (s *Server) FetchX509Bundles(_ *workloadpb.X509BundlesRequest, stream grpc.ServerStreamingServer[workloadpb.X509BundlesResponse]) error {
	return serve(s, stream.Context(), []string{secretcache.FederatedRootName}, s.bundlesResponse,
		func(r *encoded) error {
			if err := stream.Send(r.bundles); err != nil {
				return err
			}
			s.metrics.pushes.WithLabelValues("FetchX509Bundles").Inc()
			return nil
		})
}

// serve runs one stream: it watches names, and sends what current returns
// whenever that changed, until the client leaves. current returns nil while
// the secrets do not exist yet; a watch reports when they do.
func serve(s *Server, ctx context.Context, names []string, current func(context.Context) (*encoded, error), send func(*encoded) error) error {
	changed := make(chan struct{}, 1)
	poke := func(*secretcache.Secret) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	// Watch before reading, so that a change in between is not missed.
	for _, n := range names {
		defer s.src.Watch(n, poke)()
	}
	var last *encoded
	for {
		r, err := current(ctx)
		if err != nil {
			return err
		}
		if r != nil && r != last {
			if err := send(r); err != nil {
				return err
			}
			last = r
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// encoded is the wire form of one (certificate, roots) pair, built once and
// shared by every stream: 1,000 streams of one rotation marshal the key and
// concatenate the DER once, not 1,000 times. The messages are never
// modified after they are built; gRPC only reads them.
type encoded struct {
	certVersion, rootVersion string
	svid                     *workloadpb.X509SVIDResponse
	bundles                  *workloadpb.X509BundlesResponse
}

// responses holds the last encoded pairs.
type responses struct {
	mu      sync.Mutex
	svid    *encoded
	bundles *encoded
}

// secrets returns the current certificate (when withCert) and roots, or
// nils when they do not exist yet. The roots are ROOTCA_FEDERATED: the
// mesh's own (Roots) and each federated trust domain's (Federated).
func (s *Server) secrets(ctx context.Context, withCert bool) (cert, roots *secretcache.Secret, err error) {
	if withCert {
		if cert, err = s.src.Secret(ctx, secretcache.DefaultName); err != nil {
			return nil, nil, s.notReady(ctx, secretcache.DefaultName, err)
		}
	}
	if roots, err = s.src.Secret(ctx, secretcache.FederatedRootName); err != nil {
		return nil, nil, s.notReady(ctx, secretcache.FederatedRootName, err)
	}
	return cert, roots, nil
}

// notReady turns a Secret failure into the stream's end (the client left)
// or nil: the stream waits for the watch to report the secret.
func (s *Server) notReady(ctx context.Context, name string, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if !errors.Is(err, secretcache.ErrNotReady) {
		s.log.Warn("Workload API: secret unavailable", logs.KeyName, name, logs.KeyError, err)
	} else {
		s.log.Debug("Workload API: secret not ready; waiting", logs.KeyName, name, logs.KeyError, err)
	}
	return nil
}

func (s *Server) svidResponse(ctx context.Context) (*encoded, error) {
	cert, roots, err := s.secrets(ctx, true)
	if err != nil || roots == nil {
		return nil, err
	}
	s.x509.mu.Lock()
	defer s.x509.mu.Unlock()
	if e := s.x509.svid; e != nil && e.certVersion == cert.Version && e.rootVersion == roots.Version {
		return e, nil
	}
	e, err := encodeSVID(cert, roots)
	if err != nil {
		// No key material in the log: the error names what failed.
		s.log.Error("Workload API: cannot encode the SVID", logs.KeyError, err)
		return nil, status.Error(codes.Internal, "cannot encode the SVID")
	}
	s.x509.svid = e
	return e, nil
}

func (s *Server) bundlesResponse(ctx context.Context) (*encoded, error) {
	_, roots, err := s.secrets(ctx, false)
	if err != nil || roots == nil {
		return nil, err
	}
	s.x509.mu.Lock()
	defer s.x509.mu.Unlock()
	if e := s.x509.bundles; e != nil && e.rootVersion == roots.Version {
		return e, nil
	}
	td := roots.TrustDomain
	if td.IsZero() {
		return nil, status.Error(codes.Internal, "trust bundle without trust domain")
	}
	bundles := federatedDER(roots)
	bundles[td.IDString()] = concatDER(roots.Roots)
	e := &encoded{rootVersion: roots.Version, bundles: &workloadpb.X509BundlesResponse{Bundles: bundles}}
	s.x509.bundles = e
	return e, nil
}

// encodeSVID builds the FetchX509SVID response of cert and roots.
func encodeSVID(cert, roots *secretcache.Secret) (*encoded, error) {
	if len(cert.Chain) == 0 || cert.Key == nil {
		return nil, errors.New("certificate secret without chain or key")
	}
	id, err := x509svid.IDFromCert(cert.Chain[0])
	if err != nil {
		return nil, fmt.Errorf("leaf: %w", err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.Key)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	svid := &workloadpb.X509SVID{
		SpiffeId:    id.String(),
		X509Svid:    concatDER(cert.Chain),
		X509SvidKey: key,
		Bundle:      concatDER(roots.Roots),
	}
	resp := &workloadpb.X509SVIDResponse{Svids: []*workloadpb.X509SVID{svid}, FederatedBundles: federatedDER(roots)}
	return &encoded{certVersion: cert.Version, rootVersion: roots.Version, svid: resp}, nil
}

// federatedDER returns each federated trust domain's roots (DER,
// concatenated) keyed by trust domain SPIFFE ID, in a new map.
func federatedDER(roots *secretcache.Secret) map[string][]byte {
	out := make(map[string][]byte, len(roots.Federated)+1)
	for td, cs := range roots.Federated {
		out[td.IDString()] = concatDER(cs)
	}
	return out
}

func concatDER(certs []*x509.Certificate) []byte {
	n := 0
	for _, c := range certs {
		n += len(c.Raw)
	}
	out := make([]byte, 0, n)
	for _, c := range certs {
		out = append(out, c.Raw...)
	}
	return out
}
