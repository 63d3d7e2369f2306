package cryptobound

import (
	"cmp"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// DefaultDuration is how long Measure runs when Config.Duration is 0.
const DefaultDuration = 2 * time.Second

// Config configures a measurement.
type Config struct {
	// LeafKeyType is the key type of the CSRs; empty means ec-p256.
	LeafKeyType certs.KeyType
	// CAKeyType is the key type of the CA's signing key; empty means
	// ec-p256.
	CAKeyType certs.KeyType
	// Workers run in parallel; 0 means GOMAXPROCS, every CPU the CA
	// could use.
	Workers int
	// Duration of the measurement; 0 means 2s.
	Duration time.Duration
	// CPU, when set, reads the CPU time the process has used so far
	// (cputime.Self); Measure reads it before and after, so that Result
	// has the CPU time per pair, which other load on the machine does not
	// distort.
	CPU   func() (time.Duration, error)
	Clock clock.Clock
}

// Result is a measured bound.
type Result struct {
	LeafKeyType certs.KeyType
	CAKeyType   certs.KeyType
	Workers     int
	Operations  int64 // CSR checks plus CA signatures done, in pairs
	Elapsed     time.Duration
	// PerSecond is issuances per second: Operations/Elapsed.
	PerSecond float64
	// CPU is the process CPU time used during the measurement, when
	// Config.CPU was set; CPUPerOp is CPU/Operations.
	CPU      time.Duration
	CPUPerOp time.Duration
}

// Measure runs CSR signature checks and CA signatures in pairs on Workers
// goroutines for Duration and returns the rate of pairs per second.
func Measure(ctx context.Context, cfg Config) (*Result, error) {
	cfg.LeafKeyType = cmp.Or(cfg.LeafKeyType, certs.ECP256)
	cfg.CAKeyType = cmp.Or(cfg.CAKeyType, certs.ECP256)
	if cfg.Workers < 0 || cfg.Duration < 0 {
		return nil, errors.New("cryptobound: workers and duration must not be negative")
	}
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	cfg.Duration = cmp.Or(cfg.Duration, DefaultDuration)
	clk := clock.OrReal(cfg.Clock)

	leafKey, err := certs.GenerateKey(cfg.LeafKeyType)
	if err != nil {
		return nil, fmt.Errorf("cryptobound: %w", err)
	}
	der, err := certs.NewCSR(leafKey, spiffeid.RequireFromString("spiffe://cluster.local/ns/bench/sa/bench-0"))
	if err != nil {
		return nil, fmt.Errorf("cryptobound: %w", err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("cryptobound: %w", err)
	}
	caKey, err := certs.GenerateKey(cfg.CAKeyType)
	if err != nil {
		return nil, fmt.Errorf("cryptobound: %w", err)
	}
	sign := signer(caKey, csr.Raw)
	if err := sign(); err != nil { // also warms up lazily built tables
		return nil, err
	}

	var stop atomic.Bool
	var ops atomic.Int64
	errs := make(chan error, cfg.Workers)
	var wg sync.WaitGroup
	var cpu0 time.Duration
	if cfg.CPU != nil {
		if cpu0, err = cfg.CPU(); err != nil {
			return nil, fmt.Errorf("cryptobound: %w", err)
		}
	}
	start := clk.Now()
	for range cfg.Workers {
		wg.Go(func() {
			var n int64
			defer func() { ops.Add(n) }()
			for { // at least one pair per worker
				if err := csr.CheckSignature(); err != nil {
					errs <- fmt.Errorf("cryptobound: CSR signature: %w", err)
					return
				}
				if err := sign(); err != nil {
					errs <- err
					return
				}
				n++
				if stop.Load() {
					return
				}
			}
		})
	}
	timer := clk.NewTimer(cfg.Duration)
	var runErr error
	select {
	case <-timer.C():
	case <-ctx.Done():
		runErr = ctx.Err()
	case runErr = <-errs:
	}
	timer.Stop()
	stop.Store(true)
	wg.Wait()
	elapsed := clk.Now().Sub(start)
	if runErr != nil {
		return nil, runErr
	}
	res := &Result{LeafKeyType: cfg.LeafKeyType, CAKeyType: cfg.CAKeyType, Workers: cfg.Workers,
		Operations: ops.Load(), Elapsed: elapsed}
	if elapsed > 0 {
		res.PerSecond = float64(res.Operations) / elapsed.Seconds()
	}
	if cfg.CPU != nil {
		cpu1, err := cfg.CPU()
		if err != nil {
			return nil, fmt.Errorf("cryptobound: %w", err)
		}
		res.CPU = cpu1 - cpu0
		if res.Operations > 0 {
			res.CPUPerOp = res.CPU / time.Duration(res.Operations)
		}
	}
	return res, nil
}

// signer returns a function that signs a certificate-sized message with key
// the way x509.CreateCertificate does for the key's type (the digest that
// the CA's signature algorithm uses, or the message itself for Ed25519).
func signer(key crypto.Signer, tbs []byte) func() error {
	var opts crypto.SignerOpts
	var digest func() []byte
	switch certs.SignatureAlgorithmFor(key.Public()) {
	case x509.ECDSAWithSHA384:
		opts, digest = crypto.SHA384, func() []byte { d := sha512.Sum384(tbs); return d[:] }
	case x509.ECDSAWithSHA512:
		opts, digest = crypto.SHA512, func() []byte { d := sha512.Sum512(tbs); return d[:] }
	case x509.PureEd25519:
		opts, digest = crypto.Hash(0), func() []byte { return tbs }
	default: // ECDSA P-256 and RSA with SHA-256
		opts, digest = crypto.SHA256, func() []byte { d := sha256.Sum256(tbs); return d[:] }
	}
	return func() error {
		if _, err := key.Sign(rand.Reader, digest(), opts); err != nil {
			return fmt.Errorf("cryptobound: CA signature: %w", err)
		}
		return nil
	}
}
