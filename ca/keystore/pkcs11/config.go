package pkcs11

import (
	"cmp"
	"errors"
	"time"

	"github.com/meshid/meshid/internal/clock"
)

// Defaults.
const (
	// DefaultSessionWait bounds how long a signature may take in all: the
	// wait for the module (a reopen in progress, a free session) and the
	// module call itself. Past it the request fails with Unavailable
	// instead of hanging, even when the module never returns.
	DefaultSessionWait = 5 * time.Second
	// DefaultMaxSessions is the number of module sessions kept open (one is
	// the long-lived login session).
	DefaultMaxSessions = 16
)

// Config names a key in a module.
type Config struct {
	URI         *URI          // from ParseURI; required
	SessionWait time.Duration // 0 = DefaultSessionWait
	MaxSessions int           // 0 = DefaultMaxSessions; at least 2
	Clock       clock.Clock   // nil = the wall clock; tests inject a fake
}

func (cfg Config) withDefaults() (Config, error) {
	if cfg.URI == nil {
		return cfg, errors.New("pkcs11: URI is required")
	}
	cfg.SessionWait = cmp.Or(cfg.SessionWait, DefaultSessionWait)
	cfg.MaxSessions = cmp.Or(cfg.MaxSessions, DefaultMaxSessions)
	cfg.Clock = clock.OrReal(cfg.Clock)
	if cfg.SessionWait < 0 || cfg.MaxSessions < 2 {
		return cfg, errors.New("pkcs11: SessionWait must be positive and MaxSessions at least 2")
	}
	return cfg, nil
}
