//go:build cgo

package pkcs11

import (
	"crypto"
	"errors"
	"fmt"

	"github.com/ThalesGroup/crypto11"
	miekg "github.com/miekg/pkcs11"
)

// Destroy erases the key pair from the module, then closes k. It first
// waits for the signatures in flight (at most Config.SessionWait); a
// signature asked for afterwards fails. When it fails, k stays open so
// that Destroy may be tried again (Close it otherwise). The CA destroys
// the key of an intermediate it no longer signs with
// (ca/upstream.ModuleKeys).
func (k *Key) Destroy() error {
	deadline := k.cfg.Clock.NewTimer(k.cfg.SessionWait)
	defer deadline.Stop()
	taken := 0
	defer func() {
		for ; taken > 0; taken-- {
			<-k.calls
		}
	}()
	for taken < cap(k.calls) { // every call slot: no signature in flight
		select {
		case k.calls <- struct{}{}:
			taken++
		case <-deadline.C():
			return fmt.Errorf("pkcs11: destroy %s: signatures in flight did not end within %v", keyName(k.cfg.URI), k.cfg.SessionWait)
		}
	}
	c, err := k.conn(deadline.C())
	if err != nil {
		return fmt.Errorf("pkcs11: destroy %s: %w", keyName(k.cfg.URI), err)
	}
	done := make(chan error, 1)
	go func() { done <- c.signer.Delete() }()
	select {
	case err = <-done:
	case <-deadline.C():
		err = fmt.Errorf("the module did not return within %v", k.cfg.SessionWait)
	}
	if err != nil {
		return fmt.Errorf("pkcs11: destroy %s: %w", keyName(k.cfg.URI), err)
	}
	return k.Close()
}

// KeyInfo describes a key pair found in a token by List.
type KeyInfo struct {
	ID     []byte // CKA_ID
	Label  string // CKA_LABEL
	Public crypto.PublicKey
	// Sensitive and Extractable are the private key's CKA_SENSITIVE and
	// CKA_EXTRACTABLE: a CA key is sensitive and not extractable.
	Sensitive, Extractable bool
}

// List returns the key pairs of the token of cfg.URI labelled with its
// object= (every key pair when the URI has none). It reads attributes
// only: no key leaves the module. Tests and operators use it to see which
// keys the CA keeps. A key destroyed while it lists is left out.
func List(cfg Config) ([]KeyInfo, error) {
	k, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	u := k.cfg.URI
	ctx, err := crypto11.Configure(&crypto11.Config{
		Path: u.ModulePath, TokenLabel: u.Token, TokenSerial: u.Serial, Pin: k.pin,
		MaxSessions: k.cfg.MaxSessions, PoolWaitTimeout: k.cfg.SessionWait,
	})
	if err != nil {
		return nil, fmt.Errorf("pkcs11: open token %s in module %s: %w", tokenName(u), u.ModulePath, err)
	}
	defer ctx.Close()
	for attempt := 0; ; attempt++ {
		ks, err := list(ctx, u)
		if err == nil || attempt == 4 || !racing(err) {
			return ks, err
		}
	}
}

// vanished reports whether err is the module saying that an object found
// a moment ago is no longer there.
func vanished(err error) bool {
	var e miekg.Error
	return errors.As(err, &e) && (e == miekg.CKR_OBJECT_HANDLE_INVALID || e == miekg.CKR_KEY_HANDLE_INVALID)
}

// racing reports whether err may come from a key destroyed while List
// reads it: SoftHSM2 also answers CKR_ATTRIBUTE_VALUE_INVALID when the
// key pair's other half went between its search and its read. List then
// starts again.
func racing(err error) bool {
	var e miekg.Error
	return vanished(err) || errors.As(err, &e) && e == miekg.CKR_ATTRIBUTE_VALUE_INVALID
}

func list(ctx *crypto11.Context, u *URI) ([]KeyInfo, error) {
	var (
		found []crypto11.Signer
		err   error
	)
	if u.Object == "" && len(u.ID) == 0 {
		found, err = ctx.FindAllKeyPairs()
	} else {
		var label []byte
		if u.Object != "" {
			label = []byte(u.Object)
		}
		found, err = ctx.FindKeyPairs(u.ID, label)
	}
	if err != nil {
		return nil, fmt.Errorf("pkcs11: list keys %s: %w", keyName(u), err)
	}
	out := make([]KeyInfo, 0, len(found))
	for _, s := range found {
		attrs, err := ctx.GetAttributes(s, []crypto11.AttributeType{crypto11.CkaId, crypto11.CkaLabel, crypto11.CkaSensitive, crypto11.CkaExtractable})
		if vanished(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pkcs11: list keys %s: %w", keyName(u), err)
		}
		ki := KeyInfo{Public: s.Public()}
		if a := attrs[crypto11.CkaId]; a != nil {
			ki.ID = append([]byte(nil), a.Value...)
		}
		if a := attrs[crypto11.CkaLabel]; a != nil {
			ki.Label = string(a.Value)
		}
		if a := attrs[crypto11.CkaSensitive]; a != nil {
			ki.Sensitive = !isFalse(a.Value)
		}
		if a := attrs[crypto11.CkaExtractable]; a != nil {
			ki.Extractable = !isFalse(a.Value)
		}
		out = append(out, ki)
	}
	return out, nil
}
