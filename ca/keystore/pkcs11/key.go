//go:build cgo

package pkcs11

import (
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThalesGroup/crypto11"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
)

// ReopenInterval is the least time between two attempts to reopen a module
// that failed: a dead module costs one attempt per interval, not one per
// request.
const ReopenInterval = time.Second

// Key is a private key held in a PKCS#11 module: a crypto.Signer whose
// private half never leaves the module. It is safe for concurrent use.
//
// When a signature fails (the module was finalized, lost its sessions or
// its token) the failure is returned wrapping keystore.ErrKeyUnavailable,
// the module is closed, and a later Sign reopens it (at most once per
// ReopenInterval) and checks that the key found has the same public key.
type Key struct {
	cfg Config
	pin string
	pub crypto.PublicKey

	cur      atomic.Pointer[conn] // nil while the module is down
	mu       sync.Mutex           // serialises reopen and close
	nextTry  time.Time            // guarded by mu
	lastErr  error                // guarded by mu
	closed   bool                 // guarded by mu
	now      func() time.Time     // the clock, replaced in tests
	reopened atomic.Int64         // successful reopens, for tests
}

type conn struct {
	ctx    *crypto11.Context
	signer crypto11.Signer
}

// New opens the module named by cfg.URI, logs in with the PIN from its
// pin-source and finds the key. It fails with a clear error when the module
// is missing, the PIN is wrong, the token or key is not found, or the key
// could be exported from the module (CKA_EXTRACTABLE true or CKA_SENSITIVE
// false).
func New(cfg Config) (*Key, error) {
	k, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	c, err := k.open(false, "")
	if err != nil {
		return nil, err
	}
	k.pub = c.signer.Public()
	k.cur.Store(c)
	return k, nil
}

// Generate creates a new key pair of type kt in the module, labelled with
// the URI's object (and id, or a random id), and returns it. The private key
// is created sensitive and not extractable. It refuses to replace a key that
// already has that label or id.
func Generate(cfg Config, kt certs.KeyType) (*Key, error) {
	k, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	if k.cfg.URI.Object == "" {
		return nil, errors.New("pkcs11: a key to create needs a label (object=)")
	}
	c, err := k.open(true, kt)
	if err != nil {
		return nil, err
	}
	k.pub = c.signer.Public()
	k.cur.Store(c)
	return k, nil
}

func prepare(cfg Config) (*Key, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkModule(cfg.URI.ModulePath); err != nil {
		return nil, err
	}
	pin, err := ReadPIN(cfg.URI.PINSource)
	if err != nil {
		return nil, err
	}
	return &Key{cfg: cfg, pin: pin, now: time.Now}, nil
}

// open configures a crypto11 context and finds (or, with generate, creates)
// the key. Errors name the URI, never the PIN.
func (k *Key) open(generate bool, kt certs.KeyType) (*conn, error) {
	u := k.cfg.URI
	ctx, err := crypto11.Configure(&crypto11.Config{
		Path:            u.ModulePath,
		TokenLabel:      u.Token,
		TokenSerial:     u.Serial,
		Pin:             k.pin,
		MaxSessions:     k.cfg.MaxSessions,
		PoolWaitTimeout: k.cfg.SessionWait,
	})
	if err != nil {
		return nil, fmt.Errorf("pkcs11: open token %s in module %s: %w", tokenName(u), u.ModulePath, err)
	}
	var label []byte
	if u.Object != "" {
		label = []byte(u.Object)
	}
	found, err := ctx.FindKeyPairs(u.ID, label)
	if err != nil {
		ctx.Close()
		return nil, fmt.Errorf("pkcs11: find key %s: %w", keyName(u), err)
	}
	var signer crypto11.Signer
	switch {
	case len(found) > 1:
		ctx.Close()
		return nil, fmt.Errorf("pkcs11: token %s holds %d key pairs %s; name one (add id=)", tokenName(u), len(found), keyName(u))
	case len(found) == 1:
		signer = found[0]
	}
	switch {
	case generate && signer != nil:
		ctx.Close()
		return nil, fmt.Errorf("pkcs11: token %s already holds a key %s; refusing to create another", tokenName(u), keyName(u))
	case generate:
		if signer, err = generateKey(ctx, u, kt); err != nil {
			ctx.Close()
			return nil, err
		}
	case signer == nil:
		ctx.Close()
		return nil, fmt.Errorf("pkcs11: token %s holds no key pair %s", tokenName(u), keyName(u))
	}
	if err := checkCustody(ctx, signer); err != nil {
		ctx.Close()
		return nil, fmt.Errorf("pkcs11: key %s: %w", keyName(u), err)
	}
	return &conn{ctx: ctx, signer: signer}, nil
}

func generateKey(ctx *crypto11.Context, u *URI, kt certs.KeyType) (crypto11.Signer, error) {
	id := u.ID
	if len(id) == 0 {
		id = make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return nil, err
		}
	}
	var (
		s   crypto11.Signer
		err error
	)
	switch kt {
	case certs.ECP256, "":
		s, err = ctx.GenerateECDSAKeyPairWithLabel(id, []byte(u.Object), elliptic.P256())
	case certs.ECP384:
		s, err = ctx.GenerateECDSAKeyPairWithLabel(id, []byte(u.Object), elliptic.P384())
	case certs.RSA2048, certs.RSA3072, certs.RSA4096:
		bits := map[certs.KeyType]int{certs.RSA2048: 2048, certs.RSA3072: 3072, certs.RSA4096: 4096}[kt]
		s, err = ctx.GenerateRSAKeyPairWithLabel(id, []byte(u.Object), bits)
	default:
		return nil, fmt.Errorf("pkcs11: key type %q cannot be created in a module (want ec-p256, ec-p384, rsa-2048, rsa-3072 or rsa-4096)", kt)
	}
	if err != nil {
		return nil, fmt.Errorf("pkcs11: create %s key %s: %w", kt, keyName(u), err)
	}
	return s, nil
}

// checkCustody refuses a private key the module would hand out.
func checkCustody(ctx *crypto11.Context, s crypto11.Signer) error {
	attrs, err := ctx.GetAttributes(s, []crypto11.AttributeType{crypto11.CkaExtractable, crypto11.CkaSensitive})
	if err != nil {
		return fmt.Errorf("read CKA_EXTRACTABLE and CKA_SENSITIVE: %w", err)
	}
	if a := attrs[crypto11.CkaExtractable]; a == nil || !isFalse(a.Value) {
		return errors.New("the module allows exporting it (CKA_EXTRACTABLE is not false); create a non-extractable key")
	}
	if a := attrs[crypto11.CkaSensitive]; a == nil || isFalse(a.Value) {
		return errors.New("the module may reveal it (CKA_SENSITIVE is not true); create a sensitive key")
	}
	return nil
}

func isFalse(v []byte) bool { return len(v) == 1 && v[0] == 0 }

// Public returns the public key, read from the module once at New.
func (k *Key) Public() crypto.PublicKey { return k.pub }

// Sign signs digest in the module. A failure wraps
// keystore.ErrKeyUnavailable.
func (k *Key) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	c, err := k.conn()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", keystore.ErrKeyUnavailable, err)
	}
	sig, err := c.signer.Sign(r, digest, opts)
	if err != nil {
		k.drop(c, err)
		return nil, fmt.Errorf("%w: pkcs11: sign with %s: %v", keystore.ErrKeyUnavailable, keyName(k.cfg.URI), err)
	}
	return sig, nil
}

// conn returns the open module, or reopens it if it failed and the last
// attempt is older than ReopenInterval.
func (k *Key) conn() (*conn, error) {
	if c := k.cur.Load(); c != nil {
		return c, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.cur.Load(); c != nil {
		return c, nil
	}
	if k.closed {
		return nil, errors.New("pkcs11: key closed")
	}
	now := k.now()
	if now.Before(k.nextTry) {
		return nil, fmt.Errorf("pkcs11: module down (%v); retrying from %s", k.lastErr, k.nextTry.UTC().Format(time.RFC3339))
	}
	k.nextTry = now.Add(ReopenInterval)
	c, err := k.open(false, "")
	if err == nil && !certs.KeyMatches(k.pub, c.signer) {
		c.ctx.Close()
		err = fmt.Errorf("pkcs11: key %s in the reopened module is not the key the CA started with", keyName(k.cfg.URI))
	}
	if err != nil {
		k.lastErr = err
		return nil, err
	}
	k.cur.Store(c)
	k.reopened.Add(1)
	return c, nil
}

// drop closes c after a failed signature, so the next Sign reopens the
// module. Closing waits for c's other signatures in flight to return.
func (k *Key) drop(c *conn, cause error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.cur.CompareAndSwap(c, nil) {
		return // already dropped by a concurrent failure
	}
	k.lastErr = cause
	c.ctx.Close()
}

// Close logs out and releases the module. Later signatures fail.
func (k *Key) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	if c := k.cur.Swap(nil); c != nil {
		return c.ctx.Close()
	}
	return nil
}

// String names the key without any secret.
func (k *Key) String() string { return "PKCS#11 key " + keyName(k.cfg.URI) }

func tokenName(u *URI) string {
	if u.Token != "" {
		return fmt.Sprintf("%q", u.Token)
	}
	return fmt.Sprintf("with serial %q", u.Serial)
}

func keyName(u *URI) string {
	s := ""
	if u.Object != "" {
		s = fmt.Sprintf("object=%q", u.Object)
	}
	if len(u.ID) > 0 {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("id=%x", u.ID)
	}
	return s
}
