package pkcs11

import (
	"errors"
	"time"
)

// Defaults.
const (
	// DefaultSessionWait bounds how long a signature waits for a free
	// module session; past it the request fails with Unavailable instead of
	// hanging.
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
}

func (cfg Config) withDefaults() (Config, error) {
	if cfg.URI == nil {
		return cfg, errors.New("pkcs11: URI is required")
	}
	if cfg.SessionWait == 0 {
		cfg.SessionWait = DefaultSessionWait
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.SessionWait < 0 || cfg.MaxSessions < 2 {
		return cfg, errors.New("pkcs11: SessionWait must be positive and MaxSessions at least 2")
	}
	return cfg, nil
}
