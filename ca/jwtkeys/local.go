package jwtkeys

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// FileName is the Local store's file in its directory.
const FileName = "jwt-keys.json"

// LocalConfig configures a Local store.
type LocalConfig struct {
	// Dir keeps the keys in Dir/FileName (mode 0600, written atomically);
	// "" keeps them in memory only.
	Dir string
	// Lifetime of each key; 0 means DefaultLifetime, within MinLifetime
	// and MaxLifetime.
	Lifetime time.Duration
	// TTL of the tokens: how long a retired key stays published. Required.
	TTL time.Duration

	Clock  clock.Clock
	Logger *slog.Logger // nil discards logs
}

// Local is the key Set of one CA process. It rotates the Set when asked
// for it (Keys), so it needs no goroutine. Safe for concurrent use.
type Local struct {
	path     string // "" in memory
	lifetime time.Duration
	ttl      time.Duration
	clock    clock.Clock
	log      *slog.Logger

	mu  sync.Mutex
	set *Set
	due time.Time // set.NextChange: before it, Keys returns set as it is
}

// NewLocal validates cfg and returns the store, with the Set of Dir's file
// when there is one (a file that does not parse is an error, not a reason
// to start over silently: tokens signed with it would stop validating).
func NewLocal(cfg LocalConfig) (*Local, error) {
	lifetime, err := CheckLifetime(cfg.Lifetime, cfg.TTL)
	if err != nil {
		return nil, err
	}
	l := &Local{lifetime: lifetime, ttl: cfg.TTL, clock: clock.OrReal(cfg.Clock), log: cfg.Logger}
	l.log = logs.OrDiscard(l.log)
	if cfg.Dir != "" {
		l.path = filepath.Join(cfg.Dir, FileName)
		b, err := os.ReadFile(l.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("jwtkeys: %w", err)
		default:
			if l.set, err = Parse(b); err != nil {
				return nil, fmt.Errorf("%s: %w (remove the file to start with new JWT signing keys)", l.path, err)
			}
		}
	}
	if _, err := l.Keys(); err != nil {
		return nil, err
	}
	return l, nil
}

// CheckLifetime applies the default lifetime (0 means DefaultLifetime) and
// checks it and the token TTL, for every store of a Set.
func CheckLifetime(lifetime, ttl time.Duration) (time.Duration, error) {
	if lifetime == 0 {
		lifetime = DefaultLifetime
	}
	switch {
	case ttl <= 0:
		return 0, fmt.Errorf("jwtkeys: token TTL %s must be positive", ttl)
	case lifetime < MinLifetime || lifetime > MaxLifetime:
		return 0, fmt.Errorf("jwtkeys: key lifetime %s is not within %s to %s", lifetime, MinLifetime, MaxLifetime)
	}
	return lifetime, nil
}

// Keys returns the Set right for now, rotating (and saving) it first when
// it is due.
func (l *Local) Keys() (*Set, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	if l.set != nil && now.Before(l.due) { // every Issue asks: no allocation until a change is due
		return l.set, nil
	}
	next, changed, err := Rotate(l.set, now, l.lifetime, l.ttl)
	if err != nil {
		return nil, err
	}
	l.due = next.NextChange(now, l.ttl)
	if !changed {
		return l.set, nil
	}
	l.set = next
	l.log.Info("JWT signing keys rotated", logs.KeyKeys, len(next.Keys))
	if l.path != "" {
		// A failed save costs a restart's continuity, not this process's
		// tokens: keep signing, and say so.
		if err := l.save(next); err != nil {
			l.log.Error("cannot save the JWT signing keys; a restart will start with new ones", logs.KeyPath, l.path, logs.KeyError, err)
		}
	}
	return next, nil
}

func (l *Local) save(s *Set) error {
	b, err := Encode(s)
	if err != nil {
		return err
	}
	return certs.WriteFileAtomic(l.path, b, 0o600)
}
