package secretcache

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// FederationSource gives the bundles of the trust domains the CA federates
// with: SPIFFE bundles (JSON) keyed by trust domain SPIFFE ID
// ("spiffe://<td>"); caclient.Client implements it. It must return within
// a bounded time; caclient applies its Timeout.
type FederationSource interface {
	FetchFederatedBundles(ctx context.Context) (map[string][]byte, error)
}

// Federation defaults and limits.
const (
	// DefaultFederationRefresh is how often the federated bundles are
	// asked of the CA: a change the CA fetched reaches ROOTCA_FEDERATED
	// and the Workload API within this (the issue asks for 30 s).
	DefaultFederationRefresh = 15 * time.Second
	// MaxFederatedTrustDomains bounds the trust domains taken from one
	// answer (the CA's own limit, ca/spiffefed.MaxPeers).
	MaxFederatedTrustDomains = 64
)

// federated is the ROOTCA_FEDERATED state of a Manager.
type federated struct {
	src     FederationSource // nil: the mesh's own roots only
	refresh time.Duration
	own     spiffeid.TrustDomain
	secret  atomic.Pointer[Secret]

	mu            sync.Mutex // serialises rebuilds
	bundles       map[spiffeid.TrustDomain][]*x509.Certificate
	version       string // of bundles; "" before any
	unimplemented bool   // the CA answered Unimplemented (logged once)
	federating    bool   // the CA's last answer named a trust domain

	// wake is signalled when a certificate is obtained: an idle poll
	// (a CA that federates with nobody) asks again then.
	wake chan struct{}
}

// renewed wakes an idle federation poll.
func (f *federated) renewed() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *federated) init(cfg Config) error {
	if cfg.FederationRefresh < 0 {
		return errors.New("secretcache: Config.FederationRefresh must not be negative")
	}
	f.src, f.own = cfg.Federation, cfg.ID.TrustDomain()
	f.refresh = cmp.Or(cfg.FederationRefresh, DefaultFederationRefresh)
	f.wake = make(chan struct{}, 1)
	return nil
}

// federatedSecret returns ROOTCA_FEDERATED, obtaining the mesh's roots
// first when needed.
func (m *Manager) federatedSecret(ctx context.Context) (*Secret, error) {
	if s := m.fed.secret.Load(); s != nil {
		return s, nil
	}
	if _, err := m.Secret(ctx, RootName); err != nil {
		return nil, err
	}
	m.rebuildFederated()
	if s := m.fed.secret.Load(); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrNotReady, FederatedRootName)
}

// rebuildFederated makes ROOTCA_FEDERATED of the current ROOTCA and
// federated bundles, and pushes it when it changed.
func (m *Manager) rebuildFederated() {
	roots := m.roots.Load()
	if roots == nil {
		return
	}
	f := &m.fed
	f.mu.Lock()
	s := &Secret{
		Name: FederatedRootName, Version: roots.Version + "-" + f.version,
		Roots: roots.Roots, TrustDomain: roots.TrustDomain, Federated: f.bundles,
		NotAfter: roots.NotAfter, // the mesh's roots: as ROOTCA
	}
	cur := f.secret.Load()
	changed := cur == nil || cur.Version != s.Version
	if changed {
		f.secret.Store(s)
	}
	f.mu.Unlock()
	if changed {
		m.publish(FederatedRootName)
	}
}

// runFederation asks the CA for the federated bundles at once and then
// every refresh while the CA federates, until ctx ends. While the CA
// federates with nobody (or does not serve federated bundles) no timer
// runs: every agent of a mesh without federation would otherwise ask the
// CA every refresh for nothing. It asks again whenever a certificate is
// obtained (at the first one, and at each renewal: a CA given peers is
// restarted, and each agent renews within half its certificate's life).
func (m *Manager) runFederation(ctx context.Context) {
	f := &m.fed
	if f.src == nil {
		return
	}
	for {
		var next <-chan time.Time
		var t clock.Timer
		if m.pollFederation(ctx) {
			t = m.clock.NewTimer(f.refresh)
			next = t.C()
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-next:
		case <-f.wake:
			if t != nil {
				t.Stop()
			}
		}
	}
}

// pollFederation fetches the bundles once; a failure keeps the current
// ones. It reports whether to poll again at the refresh: the CA federates
// (its last answer named a trust domain, or it sent one it could not
// parse).
func (m *Manager) pollFederation(ctx context.Context) bool {
	f := &m.fed
	raw, err := f.src.FetchFederatedBundles(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		if status.Code(errors.Unwrap(err)) == codes.Unimplemented || status.Code(err) == codes.Unimplemented {
			f.mu.Lock()
			first := !f.unimplemented
			f.unimplemented = true
			f.mu.Unlock()
			if first {
				m.log.Info("the CA does not serve federated bundles (a CA older than this agent): ROOTCA_FEDERATED holds the mesh's roots only")
			}
			return false
		}
		m.log.Warn("federated bundles: the CA's answer failed; keeping the current ones", logs.KeyError, err)
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.federating
	}
	bundles, jwtTDs, version, err := parseFederated(raw, f.own)
	if err != nil {
		m.log.Warn("federated bundles refused; keeping the current ones", logs.KeyError, err)
		return true
	}
	f.mu.Lock()
	f.federating = len(raw) > 0
	changed := version != f.version
	if changed {
		f.bundles, f.version = bundles, version
	}
	federating := f.federating
	f.mu.Unlock()
	if changed {
		m.log.Info("federated bundles updated", logs.KeyTrustDomains, len(bundles), logs.KeyVersion, version)
		m.rebuildFederated()
	}
	m.syncJWTBundle(ctx, jwtTDs, changed)
	return federating
}

// syncJWTBundle fetches the CA's JWT bundle again, when it is in use, if
// the federated bundles changed or if it lacks the JWT keys of a federated
// trust domain that has some (the CA adds them to its JWT bundle): now,
// rather than at the JWT bundle's own, longer refresh.
func (m *Manager) syncJWTBundle(ctx context.Context, jwtTDs []string, changed bool) {
	if m.jwt == nil {
		return
	}
	cur := m.jwt.bundle.Load()
	if cur == nil {
		return
	}
	missing := slices.ContainsFunc(jwtTDs, func(id string) bool { return cur.Raw[id] == nil })
	if changed || missing {
		_, _ = m.jwt.fetchBundle(ctx, cur, true)
	}
}

// parseFederated parses the CA's answer: each trust domain's x509-svid
// roots (a domain without any is left out), the SPIFFE IDs of the trust
// domains with jwt-svid keys, and a version hashed over it all. The mesh's
// own trust domain is refused: domains are never merged.
func parseFederated(raw map[string][]byte, own spiffeid.TrustDomain) (map[spiffeid.TrustDomain][]*x509.Certificate, []string, string, error) {
	if len(raw) > MaxFederatedTrustDomains {
		return nil, nil, "", fmt.Errorf("secretcache: %d federated trust domains, more than %d", len(raw), MaxFederatedTrustDomains)
	}
	if len(raw) == 0 {
		return nil, nil, "", nil // no federation: the version of none
	}
	keys := slices.Sorted(maps.Keys(raw))
	h := sha256.New()
	out := map[spiffeid.TrustDomain][]*x509.Certificate{}
	var jwtTDs []string
	for _, k := range keys {
		td, err := spiffeid.TrustDomainFromString(k)
		if err != nil {
			return nil, nil, "", fmt.Errorf("secretcache: federated bundle key %q: %w", k, err)
		}
		if td == own {
			return nil, nil, "", fmt.Errorf("secretcache: a federated bundle for the mesh's own trust domain %s", td.Name())
		}
		b, err := spiffebundle.Parse(td, raw[k])
		if err != nil {
			return nil, nil, "", fmt.Errorf("secretcache: federated bundle of %s: %w", td.Name(), err)
		}
		if roots := b.X509Authorities(); len(roots) > 0 {
			out[td] = roots
		}
		if len(b.JWTAuthorities()) > 0 {
			jwtTDs = append(jwtTDs, td.IDString())
		}
		fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(raw[k]))
		h.Write(raw[k])
	}
	if len(out) == 0 {
		out = nil
	}
	return out, jwtTDs, hex.EncodeToString(h.Sum(nil))[:16], nil
}
