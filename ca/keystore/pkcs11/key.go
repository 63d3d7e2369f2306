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
//
// A module call cannot be cancelled, and a broken module may never return
// from one (SoftHSM2 hangs or crashes in C_SignInit when finalized under a
// running call; an HSM behind a dead network link can block for ever). So
// every Sign ends within Config.SessionWait whatever the module does: the
// call runs on a goroutine of its own and the request stops waiting for it
// at the deadline, failing Unavailable and dropping the module connection;
// no lock is ever held across a module call that a request waits on
// without a deadline; and at most MaxSessions calls are outstanding, so a
// module that hangs every call strands at most MaxSessions goroutines.
type Key struct {
	cfg Config
	pin string
	pub crypto.PublicKey

	cur   atomic.Pointer[conn] // nil while the module is down
	calls chan struct{}        // one token per module call outstanding
	// reopen serialises reopening and Close. It is a channel, not a
	// sync.Mutex, so that a request can give up waiting for it at its
	// deadline while a reopen hangs in the module.
	reopen chan struct{}
	closed atomic.Bool

	mu      sync.Mutex // guards the fields below; never held across a module call
	nextTry time.Time
	lastErr error
	prev    *conn // the connection dropped last; its close may still be under way

	reopened atomic.Int64 // successful reopens, for tests
	// sign makes the module call; tests replace it to simulate a module
	// that never returns.
	sign func(s crypto.Signer, digest []byte, opts crypto.SignerOpts) ([]byte, error)
}

type conn struct {
	ctx    *crypto11.Context
	signer crypto11.Signer
	done   chan struct{} // closed once ctx.Close has returned
}

func moduleSign(s crypto.Signer, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.Sign(rand.Reader, digest, opts) // the module draws its own randomness
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
	return &Key{
		cfg:    cfg,
		pin:    pin,
		calls:  make(chan struct{}, cfg.MaxSessions),
		reopen: make(chan struct{}, 1),
		sign:   moduleSign,
	}, nil
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
	return &conn{ctx: ctx, signer: signer, done: make(chan struct{})}, nil
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

// Sign signs digest in the module. It returns within Config.SessionWait,
// whatever the module does. A failure wraps keystore.ErrKeyUnavailable.
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	deadline := k.cfg.Clock.NewTimer(k.cfg.SessionWait)
	defer deadline.Stop()
	sig, err := k.signBy(deadline.C(), digest, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: pkcs11: sign with %s: %v", keystore.ErrKeyUnavailable, keyName(k.cfg.URI), err)
	}
	return sig, nil
}

type signed struct {
	sig []byte
	err error
}

func (k *Key) signBy(expired <-chan time.Time, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	c, err := k.conn(expired)
	if err != nil {
		return nil, err
	}
	select {
	case k.calls <- struct{}{}:
	case <-expired:
		return nil, fmt.Errorf("%d module calls have not returned within %v", cap(k.calls), k.cfg.SessionWait)
	}
	res := make(chan signed, 1)
	go func() {
		defer func() { <-k.calls }() // only once the module has returned
		sig, err := k.sign(c.signer, digest, opts)
		res <- signed{sig, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			k.drop(c, r.err)
			// Let the close finish (normally at once) so that the next
			// request reopens a clean module; never past the deadline.
			select {
			case <-c.done:
			case <-expired:
			}
		}
		return r.sig, r.err
	case <-expired:
		err := fmt.Errorf("the module did not return within %v", k.cfg.SessionWait)
		k.drop(c, err)
		return nil, err
	}
}

// conn returns the open module, or reopens it if it failed and the last
// attempt is older than ReopenInterval. It gives up when expired fires.
func (k *Key) conn(expired <-chan time.Time) (*conn, error) {
	if c := k.cur.Load(); c != nil {
		return c, nil
	}
	select {
	case k.reopen <- struct{}{}:
	case <-expired:
		return nil, fmt.Errorf("pkcs11: the module is being reopened and did not answer within %v", k.cfg.SessionWait)
	}
	unlock := func() { <-k.reopen }
	if c := k.cur.Load(); c != nil {
		unlock()
		return c, nil
	}
	if k.closed.Load() {
		unlock()
		return nil, errors.New("pkcs11: key closed")
	}
	k.mu.Lock()
	prev := k.prev
	k.mu.Unlock()
	if prev != nil {
		// Opening the module again before the dropped connection is closed
		// would share its half-closed state (crypto11 counts references to
		// a module). The close waits for the old calls to return, which a
		// broken module may never do: wait no longer than the deadline.
		select {
		case <-prev.done:
		case <-expired:
			unlock()
			return nil, fmt.Errorf("pkcs11: module down; a call into it has not returned within %v", k.cfg.SessionWait)
		}
	}
	k.mu.Lock()
	now := k.cfg.Clock.Now()
	nextTry, lastErr := k.nextTry, k.lastErr
	if !now.Before(nextTry) {
		k.nextTry = now.Add(ReopenInterval)
	}
	k.mu.Unlock()
	if now.Before(nextTry) {
		unlock()
		return nil, fmt.Errorf("pkcs11: module down (%v); retrying from %s", lastErr, nextTry.UTC().Format(time.RFC3339))
	}
	res := make(chan *conn, 1)
	errc := make(chan error, 1)
	go func() {
		defer unlock()
		c, err := k.open(false, "")
		if err == nil && !certs.KeyMatches(k.pub, c.signer) {
			c.ctx.Close()
			err = fmt.Errorf("pkcs11: key %s in the reopened module is not the key the CA started with", keyName(k.cfg.URI))
		}
		if err == nil && k.closed.Load() {
			c.ctx.Close()
			err = errors.New("pkcs11: key closed")
		}
		if err != nil {
			k.mu.Lock()
			k.lastErr = err
			k.mu.Unlock()
			errc <- err
			return
		}
		k.cur.Store(c)
		k.reopened.Add(1)
		res <- c
	}()
	select {
	case c := <-res:
		return c, nil
	case err := <-errc:
		return nil, err
	case <-expired:
		return nil, fmt.Errorf("pkcs11: reopening the module did not finish within %v", k.cfg.SessionWait)
	}
}

// drop takes c out of use after a failed signature and closes it in the
// background: closing waits for c's calls in flight to return, which a
// broken module may never do.
func (k *Key) drop(c *conn, cause error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.cur.CompareAndSwap(c, nil) {
		return // already dropped by a concurrent failure
	}
	k.lastErr = cause
	k.prev = c
	go closeConn(c)
}

func closeConn(c *conn) {
	defer close(c.done)
	c.ctx.Close()
}

// Close logs out and releases the module; later signatures fail. It waits
// for signatures in flight to return, at most SessionWait, and reports a
// module that did not release in time.
func (k *Key) Close() error {
	k.closed.Store(true)
	deadline := k.cfg.Clock.NewTimer(k.cfg.SessionWait)
	defer deadline.Stop()
	select {
	case k.reopen <- struct{}{}:
		defer func() { <-k.reopen }()
	case <-deadline.C():
		return fmt.Errorf("pkcs11: close %s: a reopen of the module has not returned within %v", keyName(k.cfg.URI), k.cfg.SessionWait)
	}
	k.mu.Lock()
	prev := k.prev
	k.mu.Unlock()
	if c := k.cur.Swap(nil); c != nil {
		go closeConn(c)
		prev = c // dropped before c was opened, so already closed
	}
	if prev == nil {
		return nil
	}
	// Wait for the module to be released: the next user of the module in
	// this process (a new Key, or a test's next token) must not find it
	// still half open.
	select {
	case <-prev.done:
		return nil
	case <-deadline.C():
		return fmt.Errorf("pkcs11: close %s: a module call has not returned within %v", keyName(k.cfg.URI), k.cfg.SessionWait)
	}
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
