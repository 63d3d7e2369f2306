package upstream

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/logs"
)

// KeyIDSize is the length of the CKA_ID given to each key ModuleKeys
// creates (random, so unique in the token).
const KeyIDSize = 16

// ModuleKeysConfig configures ModuleKeys.
type ModuleKeysConfig struct {
	// URI names the token and the label (object=) of the keys, without
	// id= (each key gets its own). Required.
	URI    *pkcs11.URI
	Logger *slog.Logger // nil discards logs
}

// ModuleKeys is the KeySource of intermediates whose key lives in a
// PKCS#11 module (--upstream with --ca-key pkcs11:…). Each NewKey creates
// a sensitive, non-extractable key pair labelled with the URI's object=
// and a random CKA_ID of KeyIDSize bytes: the key never leaves the module
// and the CSR is signed by it. ModuleKeys keeps every key it made or
// loaded open until Collect destroys it or Close.
type ModuleKeys struct {
	uri *pkcs11.URI
	log *slog.Logger

	mu   sync.Mutex
	keys map[string]*moduleKey // by hex id
}

// moduleKey is a key of a ModuleKeys.
type moduleKey struct {
	*pkcs11.Key
	m  *ModuleKeys
	id []byte
	// used: the key has signed or was prepared (or was loaded from the
	// state): Collect may destroy it once it no longer is. A key just
	// made for a mint in progress is not used yet.
	used bool
}

// Destroy erases the key from the module (a mint that failed). A key
// that could not be destroyed is closed all the same: it stays in the
// module, named by no state (the error says which).
func (k *moduleKey) Destroy() error {
	k.m.mu.Lock()
	delete(k.m.keys, hex.EncodeToString(k.id))
	k.m.mu.Unlock()
	err := k.Key.Destroy()
	if err != nil {
		_ = k.Key.Close()
	}
	return err
}

// NewModuleKeys validates cfg.
func NewModuleKeys(cfg ModuleKeysConfig) (*ModuleKeys, error) {
	if cfg.URI == nil {
		return nil, errors.New("upstream: ModuleKeysConfig.URI is required")
	}
	if cfg.URI.Object == "" || len(cfg.URI.ID) > 0 {
		return nil, errors.New("upstream: with --upstream, --ca-key names where the intermediates' keys are created: give the label (object=) and no id= (each key gets a new one)")
	}
	return &ModuleKeys{uri: cfg.URI, log: logs.OrDiscard(cfg.Logger), keys: map[string]*moduleKey{}}, nil
}

func (m *ModuleKeys) config(id []byte) pkcs11.Config {
	u := *m.uri
	u.ID = id
	return pkcs11.Config{URI: &u}
}

// NewKey creates a key pair of type kt in the module with a new id.
func (m *ModuleKeys) NewKey(kt certs.KeyType) (crypto.Signer, []byte, error) {
	id := make([]byte, KeyIDSize)
	if _, err := rand.Read(id); err != nil {
		return nil, nil, err
	}
	k, err := pkcs11.Generate(m.config(id), kt)
	if err != nil {
		return nil, nil, err
	}
	mk := &moduleKey{Key: k, m: m, id: id}
	m.mu.Lock()
	m.keys[hex.EncodeToString(id)] = mk
	m.mu.Unlock()
	m.log.Info("new intermediate key created in the module", logs.KeyKey, k.String(), logs.KeyKeyID, hex.EncodeToString(id))
	return mk, id, nil
}

// Load opens the key id (named by the saved state) and keeps it. It fails
// when the module holds no such key or one it would let out.
func (m *ModuleKeys) Load(id []byte) (crypto.Signer, error) {
	h := hex.EncodeToString(id)
	m.mu.Lock()
	mk := m.keys[h]
	m.mu.Unlock()
	if mk != nil {
		return mk, nil
	}
	k, err := pkcs11.New(m.config(id))
	if err != nil {
		return nil, err
	}
	mk = &moduleKey{Key: k, m: m, id: id, used: true}
	m.mu.Lock()
	m.keys[h] = mk
	m.mu.Unlock()
	return mk, nil
}

// ID returns the id of k, when it is a key of m.
func (m *ModuleKeys) ID(k crypto.Signer) ([]byte, bool) {
	mk, ok := k.(*moduleKey)
	if !ok || mk.m != m {
		return nil, false
	}
	return mk.id, true
}

// Collect destroys, from the module, every key of m that signed or was
// prepared and no longer is: its public key is none of inUse (the key
// signing, the key prepared) and its id none of named (the keys the saved
// state names). A key made for a mint in progress is never destroyed
// here. It returns the ids destroyed; a key that could not be destroyed is
// logged and tried again at the next Collect.
func (m *ModuleKeys) Collect(inUse []crypto.PublicKey, named [][]byte) [][]byte {
	var victims []*moduleKey
	m.mu.Lock()
	for h, k := range m.keys {
		keep := false
		for _, p := range inUse {
			if p != nil && certs.KeyMatches(p, k) {
				keep = true
			}
		}
		for _, id := range named {
			if bytes.Equal(id, k.id) {
				keep = true
			}
		}
		switch {
		case keep:
			k.used = true
		case k.used:
			victims = append(victims, k)
			delete(m.keys, h)
		}
	}
	m.mu.Unlock()
	var destroyed [][]byte
	for _, k := range victims {
		if err := k.Key.Destroy(); err != nil {
			m.log.Error("the key of a retired intermediate could not be destroyed; trying again at the next change", logs.KeyKeyID, hex.EncodeToString(k.id), logs.KeyError, err)
			m.mu.Lock()
			m.keys[hex.EncodeToString(k.id)] = k
			m.mu.Unlock()
			continue
		}
		m.log.Info("the key of a retired intermediate was destroyed from the module", logs.KeyKey, k.String(), logs.KeyKeyID, hex.EncodeToString(k.id))
		destroyed = append(destroyed, k.id)
	}
	return destroyed
}

// Close closes every key of m (they stay in the module).
func (m *ModuleKeys) Close() error {
	m.mu.Lock()
	keys := m.keys
	m.keys = map[string]*moduleKey{}
	m.mu.Unlock()
	var errs []error
	for _, k := range keys {
		errs = append(errs, k.Close())
	}
	return errors.Join(errs...)
}

// KeyIDFile is the file, beside an intermediate's certificate in the state
// directory, that names its key in the module instead of a ca-key.pem.
const KeyIDFile = "ca-key.pkcs11.json"

// MaxKeyIDFileSize bounds KeyIDFile.
const MaxKeyIDFileSize = 512

// keyIDRecord is KeyIDFile's content. It never holds the PIN: the module,
// token, label and PIN come from --ca-key at each start.
type keyIDRecord struct {
	// ID is the key's CKA_ID in hex.
	ID string `json:"pkcs11_id"`
}

// EncodeKeyID is the KeyIDFile naming the key id.
func EncodeKeyID(id []byte) []byte {
	data, _ := json.Marshal(keyIDRecord{ID: hex.EncodeToString(id)})
	return append(data, '\n')
}

// ReadKeyID reads a KeyIDFile: a regular file (not a symbolic link) that
// neither group nor others may write, at most MaxKeyIDFileSize bytes,
// naming an id of 1 to 64 bytes. Errors name the file.
func ReadKeyID(path string) ([]byte, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("upstream: module key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("upstream: module key file %s is not a regular file (%s)", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 {
		return nil, fmt.Errorf("upstream: module key file %s: mode %#o lets others write it; want 0600", path, perm)
	}
	if st.Size() > MaxKeyIDFileSize {
		return nil, fmt.Errorf("upstream: module key file %s: %d bytes, more than %d", path, st.Size(), MaxKeyIDFileSize)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("upstream: module key file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxKeyIDFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("upstream: module key file: %w", err)
	}
	if len(data) > MaxKeyIDFileSize {
		return nil, fmt.Errorf("upstream: module key file %s: more than %d bytes", path, MaxKeyIDFileSize)
	}
	var rec keyIDRecord
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil || dec.More() {
		return nil, fmt.Errorf("upstream: module key file %s: not one {\"pkcs11_id\":\"HEX\"}", path)
	}
	id, err := hex.DecodeString(rec.ID)
	if err != nil || len(id) == 0 || len(id) > 64 {
		return nil, fmt.Errorf("upstream: module key file %s: the id is not 1 to 64 bytes in hex", path)
	}
	return id, nil
}
