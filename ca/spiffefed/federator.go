package spiffefed

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults and limits of a Federator (SECURITY.md's limits table).
const (
	// MinRefresh is the shortest refresh: a hint under it counts as it.
	MinRefresh = 5 * time.Second
	// DefaultRefresh is the refresh of a bundle without a hint.
	DefaultRefresh = 5 * time.Minute
	// MaxRetry bounds the wait before retrying a failed fetch.
	MaxRetry = 30 * time.Second
	// DefaultFetchTimeout bounds one fetch, connection to last byte (a
	// slow drip ends there).
	DefaultFetchTimeout = 30 * time.Second
	// DefaultMaxBundleSize bounds a fetched bundle, in bytes.
	DefaultMaxBundleSize = 1 << 20
	// MaxPeers bounds the federated trust domains.
	MaxPeers = 64
)

// Config configures a Federator.
type Config struct {
	// TrustDomain is this CA's own: never federated with.
	TrustDomain spiffeid.TrustDomain
	Peers       []Peer
	// StateDir, when set, keeps the last good bundle of each trust
	// domain (federation/<td>.json), so that a restart starts from it.
	StateDir      string
	FetchTimeout  time.Duration
	MaxBundleSize int64

	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Federator keeps the bundle of every federated trust domain fresh.
type Federator struct {
	cfg     Config
	peers   []*peerState
	byTD    map[spiffeid.TrustDomain]*peerState
	metrics *federatorMetrics
	started time.Time

	snap      atomic.Pointer[Snapshot]
	changedMu sync.Mutex
	changed   chan struct{} // closed and replaced on every change
}

// peerState is one federated trust domain.
type peerState struct {
	peer   Peer
	client *http.Client

	mu          sync.Mutex
	bundle      *spiffebundle.Bundle // the last good one; nil before any
	lastSuccess time.Time
	lastFailure time.Time
	lastErr     string
}

// Snapshot is the bundles held at one time. It is immutable.
type Snapshot struct {
	// Version changes whenever a bundle does.
	Version string
	// Bundles holds each trust domain's bundle.
	Bundles map[spiffeid.TrustDomain]*spiffebundle.Bundle
	// Encoded holds each bundle as a SPIFFE bundle (JSON), keyed by the
	// trust domain's SPIFFE ID ("spiffe://<td>").
	Encoded map[string][]byte
	// JWKS holds each trust domain's jwt-svid keys as a JWKS, keyed as
	// Encoded; trust domains without JWT keys are absent.
	JWKS map[string][]byte
}

// New validates cfg and loads the persisted and bootstrap bundles.
func New(cfg Config) (*Federator, error) {
	cfg.FetchTimeout = cmp.Or(cfg.FetchTimeout, DefaultFetchTimeout)
	cfg.MaxBundleSize = cmp.Or(cfg.MaxBundleSize, DefaultMaxBundleSize)
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("spiffefed: the CA's trust domain is required")
	}
	if len(cfg.Peers) > MaxPeers {
		return nil, fmt.Errorf("spiffefed: %d federated trust domains, more than %d", len(cfg.Peers), MaxPeers)
	}
	if cfg.FetchTimeout < 0 || cfg.MaxBundleSize < 0 {
		return nil, errors.New("spiffefed: negative fetch timeout or bundle size")
	}
	f := &Federator{cfg: cfg, started: cfg.Clock.Now(), byTD: map[spiffeid.TrustDomain]*peerState{}, changed: make(chan struct{})}
	seen := map[spiffeid.TrustDomain]bool{}
	for _, p := range cfg.Peers {
		if err := checkPeerSet(p, cfg.TrustDomain, seen); err != nil {
			return nil, err
		}
		if err := p.check(); err != nil {
			return nil, err
		}
		ps, err := f.newPeer(p)
		if err != nil {
			return nil, err
		}
		f.peers = append(f.peers, ps)
		f.byTD[p.TrustDomain] = ps
	}
	var err error
	if f.metrics, err = newFederatorMetrics(cfg.Registerer, f); err != nil {
		return nil, err
	}
	f.publish()
	return f, nil
}

// newPeer loads p's starting bundle and builds its client.
func (f *Federator) newPeer(p Peer) (*peerState, error) {
	ps := &peerState{peer: p}
	var roots *x509.CertPool
	if p.Profile == ProfileWeb {
		var err error
		if roots, err = webRoots(p.CAFile); err != nil {
			return nil, err
		}
	}
	ps.client = newClient(p, f, roots)
	b, err := f.startBundle(p)
	if err != nil {
		return nil, err
	}
	if b == nil && p.Profile == ProfileSPIFFE {
		return nil, fmt.Errorf("spiffefed: %s: profile https_spiffe needs a bootstrap bundle (bundle=PATH): none given and none kept from an earlier run", p.TrustDomain)
	}
	ps.bundle = b
	return ps, nil
}

// webRoots returns the system roots plus those of caFile.
func webRoots(caFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if caFile == "" {
		return pool, nil
	}
	cs, err := readRoots(caFile)
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		pool.AddCert(c)
	}
	return pool, nil
}

// GetX509BundleForTrustDomain implements x509bundle.Source with the newest
// bundle of each federated trust domain: an https_spiffe endpoint is
// verified with it.
func (f *Federator) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	ps := f.byTD[td]
	if ps == nil {
		return nil, fmt.Errorf("spiffefed: trust domain %s is not federated", td)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.bundle == nil {
		return nil, fmt.Errorf("spiffefed: no bundle of %s yet", td)
	}
	return ps.bundle.X509Bundle(), nil
}

// Snapshot returns the bundles held now.
func (f *Federator) Snapshot() *Snapshot { return f.snap.Load() }

// Changed returns a channel closed at the next change of the snapshot.
func (f *Federator) Changed() <-chan struct{} {
	f.changedMu.Lock()
	defer f.changedMu.Unlock()
	return f.changed
}

// publish builds the snapshot of the peers' bundles and wakes the
// watchers of Changed.
func (f *Federator) publish() {
	s := &Snapshot{Bundles: map[spiffeid.TrustDomain]*spiffebundle.Bundle{}, Encoded: map[string][]byte{}, JWKS: map[string][]byte{}}
	h := sha256.New()
	for _, ps := range f.peers {
		ps.mu.Lock()
		b := ps.bundle
		ps.mu.Unlock()
		if b == nil {
			continue
		}
		enc, err := b.Marshal()
		if err != nil {
			f.cfg.Logger.Error("federated bundle cannot be encoded", logs.KeyTrustDomain, b.TrustDomain().Name(), logs.KeyError, err)
			continue
		}
		id := b.TrustDomain().IDString()
		s.Bundles[b.TrustDomain()], s.Encoded[id] = b, enc
		if len(b.JWTAuthorities()) > 0 {
			if jwks, err := b.JWTBundle().Marshal(); err == nil {
				s.JWKS[id] = jwks
			}
		}
		fmt.Fprintf(h, "%s\n%d\n", id, len(enc))
		h.Write(enc)
	}
	s.Version = hex.EncodeToString(h.Sum(nil))[:16]
	f.snap.Store(s)
	f.changedMu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.changedMu.Unlock()
}

// Run refreshes every trust domain's bundle until ctx ends.
func (f *Federator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, ps := range f.peers {
		wg.Go(func() {
			next := f.refresh(ctx, ps)
			clock.Loop(ctx, f.cfg.Clock, next, nil, func(ctx context.Context) time.Duration { return f.refresh(ctx, ps) })
		})
	}
	wg.Wait()
	return nil
}

// refresh fetches ps's bundle once and returns the wait until the next.
func (f *Federator) refresh(ctx context.Context, ps *peerState) time.Duration {
	p := ps.peer
	ps.mu.Lock()
	cur := ps.bundle
	ps.mu.Unlock()
	if p.Profile == ProfileWeb && p.CAFile != "" {
		// ca-file is read again before every fetch, so a file that changes
		// (a ConfigMap key mounted in the pod) takes effect at the next one;
		// one that cannot be read keeps the roots read last.
		if roots, err := webRoots(p.CAFile); err != nil {
			f.cfg.Logger.Warn("federation ca-file unreadable; keeping the roots read last", logs.KeyTrustDomain, p.TrustDomain.Name(), logs.KeyError, err)
		} else {
			ps.client = newClient(p, f, roots)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, f.cfg.FetchTimeout)
	b, err := fetch(fctx, ps.client, p, cur, f.cfg.MaxBundleSize)
	cancel()
	now := f.cfg.Clock.Now()
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		reason := reasonOf(err)
		f.metrics.failures.WithLabelValues(p.TrustDomain.Name(), reason).Inc()
		ps.mu.Lock()
		ps.lastFailure, ps.lastErr = now, err.Error()
		ps.mu.Unlock()
		f.cfg.Logger.Warn("federated bundle refused; keeping the last good one", logs.KeyTrustDomain, p.TrustDomain.Name(),
			logs.KeyURL, p.URL, logs.KeyReason, reason, logs.KeyError, err, logs.KeyHaveBundle, cur != nil)
		return min(refreshOf(cur), MaxRetry)
	}
	ps.mu.Lock()
	ps.lastSuccess, ps.lastErr = now, ""
	changed := cur == nil || !b.Equal(cur)
	if changed {
		ps.bundle = b
	}
	ps.mu.Unlock()
	if changed {
		seq, _ := b.SequenceNumber()
		f.cfg.Logger.Info("federated bundle updated", logs.KeyTrustDomain, p.TrustDomain.Name(), logs.KeySequence, seq,
			logs.KeyX509Authorities, len(b.X509Authorities()), logs.KeyJWTAuthorities, len(b.JWTAuthorities()))
		f.persist(b)
		f.publish()
	}
	return refreshOf(b)
}

// refreshOf is the wait before refreshing b: its hint, at least
// MinRefresh; DefaultRefresh without one.
func refreshOf(b *spiffebundle.Bundle) time.Duration {
	if b == nil {
		return MinRefresh
	}
	hint, ok := b.RefreshHint()
	if !ok || hint <= 0 {
		return DefaultRefresh
	}
	return max(hint, MinRefresh)
}

// PeerStatus is one federated trust domain's state, for inspect.
type PeerStatus struct {
	TrustDomain string    `json:"trust_domain"`
	URL         string    `json:"url"`
	Profile     string    `json:"profile"`
	Sequence    uint64    `json:"sequence"`
	LastSuccess time.Time `json:"last_success,omitzero"`
	LastFailure time.Time `json:"last_failure,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	X509Roots   int       `json:"x509_roots"`
	JWTKeys     int       `json:"jwt_keys"`
	// RootsExpiry is the earliest NotAfter of the roots.
	RootsExpiry time.Time `json:"roots_expiry,omitzero"`
}

// Status returns every federated trust domain's state, sorted.
func (f *Federator) Status() []PeerStatus {
	out := make([]PeerStatus, 0, len(f.peers))
	for _, ps := range f.peers {
		ps.mu.Lock()
		st := PeerStatus{
			TrustDomain: ps.peer.TrustDomain.Name(), URL: ps.peer.URL, Profile: string(ps.peer.Profile),
			LastSuccess: ps.lastSuccess, LastFailure: ps.lastFailure, LastError: ps.lastErr,
		}
		if b := ps.bundle; b != nil {
			st.Sequence, _ = b.SequenceNumber()
			st.X509Roots, st.JWTKeys = len(b.X509Authorities()), len(b.JWTAuthorities())
			for _, c := range b.X509Authorities() {
				if st.RootsExpiry.IsZero() || c.NotAfter.Before(st.RootsExpiry) {
					st.RootsExpiry = c.NotAfter
				}
			}
		}
		ps.mu.Unlock()
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int { return cmp.Compare(a.TrustDomain, b.TrustDomain) })
	return out
}

// readRoots reads PEM certificates from path (at most 1 MiB).
func readRoots(path string) ([]*x509.Certificate, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	cs, err := certs.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("spiffefed: %s: %w", path, err)
	}
	return cs, nil
}

// readLimited reads a file of at most DefaultMaxBundleSize bytes.
func readLimited(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("spiffefed: %w", err)
	}
	if st.Size() > DefaultMaxBundleSize {
		return nil, fmt.Errorf("spiffefed: %s is %d bytes, more than %d", path, st.Size(), DefaultMaxBundleSize)
	}
	return os.ReadFile(path)
}

// FederatedBundles returns the bundles held now, as SPIFFE bundles and as
// JWKS, keyed by trust domain SPIFFE ID (ca/certservice's FederatedBundles).
func (f *Federator) FederatedBundles() (encoded, jwks map[string][]byte) {
	s := f.snap.Load()
	return s.Encoded, s.JWKS
}
