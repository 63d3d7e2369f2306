package spiffefed

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/logs"
)

// stateSubdir is the directory of the persisted bundles in StateDir.
const stateSubdir = "federation"

// statePath is where td's last good bundle is kept.
func (f *Federator) statePath(p Peer) string {
	return filepath.Join(f.cfg.StateDir, stateSubdir, p.TrustDomain.Name()+".json")
}

// persist writes b as the last good bundle; a failure is logged (the
// bundle is still used).
func (f *Federator) persist(b *spiffebundle.Bundle) {
	if f.cfg.StateDir == "" {
		return
	}
	ps := f.byTD[b.TrustDomain()]
	data, err := b.Marshal()
	if err == nil {
		err = os.MkdirAll(filepath.Join(f.cfg.StateDir, stateSubdir), 0o700)
	}
	if err == nil {
		err = certs.WriteFileAtomic(f.statePath(ps.peer), data, 0o644)
	}
	if err != nil {
		f.cfg.Logger.Warn("federated bundle not persisted: a restart will start from the bootstrap bundle", logs.KeyTrustDomain, b.TrustDomain().Name(), logs.KeyError, err)
	}
}

// startBundle returns p's starting bundle: the persisted one, unless the
// bootstrap file has a higher sequence number; nil when there is neither.
func (f *Federator) startBundle(p Peer) (*spiffebundle.Bundle, error) {
	var kept, boot *spiffebundle.Bundle
	if f.cfg.StateDir != "" {
		data, err := readLimited(f.statePath(p))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, err
		default:
			if kept, err = spiffebundle.Parse(p.TrustDomain, data); err != nil {
				f.cfg.Logger.Warn("persisted federated bundle ignored", logs.KeyTrustDomain, p.TrustDomain.Name(), logs.KeyError, err)
				kept = nil
			}
		}
	}
	if p.BundleFile != "" {
		var err error
		if boot, err = loadBundleFile(p); err != nil {
			return nil, err
		}
	}
	switch {
	case kept == nil:
		return boot, nil
	case boot == nil:
		return kept, nil
	}
	ks, _ := kept.SequenceNumber()
	bs, ok := boot.SequenceNumber()
	if ok && bs > ks {
		return boot, nil
	}
	return kept, nil
}

// loadBundleFile reads a bootstrap bundle: a SPIFFE bundle (JSON) or PEM
// roots.
func loadBundleFile(p Peer) (*spiffebundle.Bundle, error) {
	data, err := readLimited(p.BundleFile)
	if err != nil {
		return nil, err
	}
	var b *spiffebundle.Bundle
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		b, err = spiffebundle.Parse(p.TrustDomain, data)
	} else {
		cs, perr := certs.ParseCertificates(data)
		b, err = spiffebundle.FromX509Authorities(p.TrustDomain, cs), perr
	}
	if err == nil {
		err = checkBundle(b, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("spiffefed: %s: bootstrap bundle %s: %w", p.TrustDomain, p.BundleFile, err)
	}
	return b, nil
}
