package spiffefed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// certFileCheck is how often the https_web certificate files are checked
// for a change.
const certFileCheck = 10 * time.Second

// svidCert is the https_spiffe serving certificate: an X509-SVID for id,
// issued by the CA, reissued at half its life or when the CA's signing
// certificate changes. Its key lives only in memory.
type svidCert struct {
	authority func() *ca.Authority // nil result: the CA is not built yet
	id        spiffeid.ID
	clock     clock.Clock

	mu      sync.Mutex
	cur     *tls.Certificate
	issuer  *x509.Certificate
	renewAt time.Time
}

func (s *svidCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	a := s.authority()
	if a == nil {
		return nil, fmt.Errorf("spiffefed: the CA is not ready")
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil && now.Before(s.renewAt) && s.issuer == a.Bundle().Cert {
		return s.cur, nil
	}
	c, err := s.issue(a)
	if err != nil {
		if s.cur != nil && now.Before(s.cur.Leaf.NotAfter) {
			return s.cur, nil
		}
		return nil, err
	}
	s.cur = c
	return c, nil
}

func (s *svidCert) issue(a *ca.Authority) (*tls.Certificate, error) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		return nil, err
	}
	der, err := certs.NewCSR(key, s.id)
	if err != nil {
		return nil, err
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, err
	}
	csr, err := ca.VerifyCSR(req)
	if err != nil {
		return nil, err
	}
	issuer := a.Bundle().Cert
	iss, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: s.id, Caller: "meshid server (bundle endpoint)"})
	if err != nil {
		return nil, fmt.Errorf("spiffefed: the bundle endpoint's SVID: %w", err)
	}
	chain := [][]byte{iss.Leaf.Raw}
	for _, c := range iss.Chain {
		chain = append(chain, c.Raw)
	}
	s.issuer = issuer
	s.renewAt = certs.RenewAt(iss.Leaf.NotBefore, iss.Leaf.NotAfter, 0.5, 0)
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: iss.Leaf}, nil
}

// fileCert is the https_web serving certificate, from a certificate and a
// key file, read again when either changes (checked at most every
// certFileCheck on the clock). A file that fails to load is logged and the
// previous certificate kept.
type fileCert struct {
	certFile, keyFile string
	clock             clock.Clock
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   string
	checked time.Time
}

// load reads the files when they changed; it returns the error of a first
// load only.
func (f *fileCert) load() error {
	stamp := fileStamp(f.certFile) + "|" + fileStamp(f.keyFile)
	if f.cur != nil && stamp == f.stamp {
		return nil
	}
	c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		if f.cur != nil {
			f.log.Warn("bundle endpoint certificate files did not load; serving the previous certificate", logs.KeyCert, f.certFile, logs.KeyError, err)
			f.stamp = stamp // once per change, not per handshake
			return nil
		}
		return fmt.Errorf("spiffefed: bundle endpoint certificate: %w", err)
	}
	if f.cur != nil {
		f.log.Info("bundle endpoint certificate reloaded", logs.KeyCert, f.certFile, logs.KeyNotAfter, c.Leaf.NotAfter.UTC())
	}
	f.cur, f.stamp = &c, stamp
	return nil
}

func (f *fileCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := f.clock.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.checked) >= certFileCheck {
		f.checked = now
		if err := f.load(); err != nil {
			return nil, err
		}
	}
	return f.cur, nil
}

// fileStamp identifies a file's version by size and modification time.
func fileStamp(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%d/%d", st.Size(), st.ModTime().UnixNano())
}
