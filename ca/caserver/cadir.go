package caserver

import (
	"github.com/meshid/meshid/ca/keystore"
)

// caDirWatcher returns the watcher that reloads a plugged-in CADir (a
// mounted cacerts Secret, which the kubelet updates in place) into the
// rotation, which prepares a CA with new roots or switches an intermediate
// at once, with the module key when CAKey is set; nil when the CA material
// does not come from CADir. The root publisher follows the authority's
// bundle (the union of the roots during a rotation) by itself.
func (s *Server) caDirWatcher() (*keystore.DirWatcher, error) {
	cfg := s.cfg
	if cfg.Bundle != nil || cfg.CADir == "" || cfg.KubeCASecret {
		return nil, nil
	}
	wc := keystore.DirWatcherConfig{
		Dir:        cfg.CADir,
		Target:     s.rotation,
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	}
	if s.key != nil { // a nil *pkcs11.Key in the interface would not be nil
		wc.Key = s.key
	}
	return keystore.NewDirWatcher(wc)
}
