package boundtoken

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/internal/logs"
)

// Where the API server serves its issuer's discovery document. The JWKS
// path comes from the document's jwks_uri.
const discoveryPath = "/.well-known/openid-configuration"

// maxDocumentBytes bounds the discovery document and the JWKS.
const maxDocumentBytes = 1 << 20

// Refresh reads the issuer and keys from the API server now. On failure
// the previous ones stay.
func (v *Verifier) Refresh(ctx context.Context) error {
	v.lastRefresh.Store(v.clock.Now().UnixNano())
	ctx, cancel := context.WithTimeout(ctx, v.cfg.DiscoveryTimeout)
	defer cancel()
	ks, err := v.discover(ctx)
	if err != nil {
		v.refreshes.WithLabelValues("error").Inc()
		return err
	}
	v.refreshes.WithLabelValues("ok").Inc()
	old := v.keys.Load()
	switch {
	case old != nil && old.issuer == ks.issuer && bytes.Equal(old.raw, ks.raw):
		return nil // unchanged: keep the set, and the tokens verified with it
	case old == nil || old.issuer != ks.issuer:
		v.log.Info("discovered the cluster's service-account issuer", logs.KeyIssuer, ks.issuer, logs.KeyKeys, len(ks.keys.Keys))
	default:
		v.log.Info("the cluster's service-account keys changed", logs.KeyIssuer, ks.issuer, logs.KeyKeys, len(ks.keys.Keys))
	}
	v.keys.Store(ks)
	return nil
}

// discover reads the discovery document and the JWKS it names, both
// through the API server's authenticated REST client: the jwks_uri names
// the API server's external address, which the CA may not reach, so only
// its path is used, on the API server the CA talks to.
func (v *Verifier) discover(ctx context.Context) (*keySet, error) {
	raw, err := v.get(ctx, discoveryPath)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("boundtoken: parse %s: %w", discoveryPath, err)
	}
	if doc.Issuer == "" {
		return nil, fmt.Errorf("boundtoken: %s names no issuer", discoveryPath)
	}
	u, err := url.Parse(doc.JWKSURI)
	if err != nil || !strings.HasPrefix(u.Path, "/") {
		return nil, fmt.Errorf("boundtoken: %s: jwks_uri %q has no absolute path", discoveryPath, doc.JWKSURI)
	}
	raw, err = v.get(ctx, u.Path)
	if err != nil {
		return nil, err
	}
	keys, err := authn.ParseJWKS(raw)
	if err != nil {
		return nil, fmt.Errorf("boundtoken: %s: %w", u.Path, err)
	}
	return &keySet{issuer: doc.Issuer, keys: keys, raw: raw}, nil
}

func (v *Verifier) get(ctx context.Context, path string) ([]byte, error) {
	// The API server serves the JWKS as application/jwk-set+json and
	// answers 406 to a request that accepts only application/json.
	raw, err := v.cfg.REST.Get().AbsPath(path).SetHeader("Accept", "application/json, application/jwk-set+json").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("boundtoken: GET %s: %w", path, err)
	}
	if len(raw) > maxDocumentBytes {
		return nil, fmt.Errorf("boundtoken: GET %s: %d bytes, more than %d", path, len(raw), maxDocumentBytes)
	}
	return raw, nil
}

// errRateLimited means a refresh was asked too soon after the last one.
var errRateLimited = errors.New("boundtoken: key refresh rate limited")

// refreshForKey reads the keys again because a token of the issuer names
// a key id the set lacks, at most once per MinRefreshInterval: concurrent
// callers share one read, and a flood of made-up key ids costs one read
// per interval.
func (v *Verifier) refreshForKey(ctx context.Context) error {
	v.refreshMu.Lock()
	if v.clock.Now().UnixNano()-v.lastRefresh.Load() < int64(v.cfg.MinRefreshInterval) {
		v.refreshMu.Unlock()
		return errRateLimited
	}
	v.lastRefresh.Store(v.clock.Now().UnixNano())
	ch := v.flight.DoChan("refresh", func() (any, error) {
		// The read is shared: the first caller going away must not end it.
		return nil, v.Refresh(context.WithoutCancel(ctx))
	})
	v.refreshMu.Unlock()
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}
