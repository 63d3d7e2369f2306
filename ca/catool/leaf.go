package catool

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// LeafConfig describes a workload certificate to mint from a CA directory,
// for tests and debugging (like `spire-server x509 mint`).
type LeafConfig struct {
	CADir   string        // --ca-dir: a directory `meshid server --ca-dir` loads; required
	ID      spiffeid.ID   // --id; required
	TTL     time.Duration // 0 = ca.DefaultTTL; at most ca.DefaultMaxTTL
	KeyType certs.KeyType // default ec-p256
	Clock   clock.Clock   // default the real clock
}

// Minted is a leaf, its key, and what verifies it.
type Minted struct {
	Leaf  *x509.Certificate
	Key   crypto.Signer
	Chain []*x509.Certificate // the leaf, then the intermediates up to the roots
	Roots []*x509.Certificate
}

// Leaf mints a workload certificate for cfg.ID with a new key. It is signed
// by ca.Authority, the CA's own signing code and policy, so the leaf is
// what `meshid server --ca-dir` would issue for that identity.
func Leaf(cfg LeafConfig) (*Minted, error) {
	switch {
	case cfg.CADir == "":
		return nil, fmt.Errorf("certs leaf: --ca-dir is required")
	case cfg.ID.IsZero():
		return nil, fmt.Errorf("certs leaf: --id is required")
	}
	if cfg.KeyType == "" {
		cfg.KeyType = certs.ECP256
	}
	clk := clock.OrReal(cfg.Clock)
	bundle, err := keystore.LoadDir(cfg.CADir, clk.Now())
	if err != nil {
		return nil, fmt.Errorf("certs leaf: --ca-dir: %v", err)
	}
	auth, err := ca.New(ca.Config{TrustDomain: cfg.ID.TrustDomain(), Bundle: bundle, Clock: clk, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("certs leaf: %v", err)
	}
	key, err := certs.GenerateKey(cfg.KeyType)
	if err != nil {
		return nil, fmt.Errorf("certs leaf: --key-type: %v", err)
	}
	csrDER, err := certs.NewCSR(key, cfg.ID)
	if err != nil {
		return nil, fmt.Errorf("certs leaf: %v", err)
	}
	req, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("certs leaf: %v", err)
	}
	csr, err := ca.VerifyCSR(req)
	if err != nil {
		return nil, fmt.Errorf("certs leaf: %v", err)
	}
	issued, err := auth.Sign(context.Background(), ca.Request{CSR: csr, ID: cfg.ID, Caller: "meshid certs leaf", TTL: cfg.TTL})
	if err != nil {
		return nil, fmt.Errorf("certs leaf: %v", err)
	}
	chain := append([]*x509.Certificate{issued.Leaf}, issued.Chain...)
	return &Minted{Leaf: issued.Leaf, Key: key, Chain: chain, Roots: issued.Roots}, nil
}
