package keystore

import (
	"cmp"
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// DefaultDirReloadDelay is how long a DirWatcher waits after the first
// change it sees before reloading: the changes of that window (a kubelet
// symlink swap, or an operator copying four files one by one) make one
// reload, and a storm of changes at most one reload per delay.
const DefaultDirReloadDelay = time.Second

// dataLink is the symbolic link through which the kubelet updates a Secret
// or ConfigMap volume atomically: it writes a new timestamped directory,
// points ..data_tmp at it and renames ..data_tmp over ..data.
const dataLink = "..data"

// Reload results, the values of meshid_ca_dir_reloads_total's label.
const (
	ReloadApplied   = "applied"   // a new bundle is in use
	ReloadUnchanged = "unchanged" // the directory holds the bundle in use
	ReloadFailed    = "failed"    // the new content was refused; the previous bundle stays
)

// BundleTarget is what a DirWatcher feeds: *ca.Authority is one.
type BundleTarget interface {
	Bundle() *Bundle
	SetBundle(*Bundle) error
}

// refuser is a BundleTarget that wants to know of a directory that could
// not be loaded (ca/rotation.Manager: its rotation is then stuck).
type refuser interface{ Refuse(error) }

// DirWatcherConfig configures a DirWatcher.
type DirWatcherConfig struct {
	// Dir is the plugged-in CA directory (LoadDir's layouts), typically a
	// mounted cacerts Secret. Required.
	Dir string
	// Key, when set, is the CA key held outside the directory (a PKCS#11
	// module): the directory is loaded with LoadDirSigner and this key.
	Key crypto.Signer
	// Target receives every new valid bundle. Required.
	Target BundleTarget
	// ReloadDelay is the wait between a change and the reload; 0 takes
	// DefaultDirReloadDelay.
	ReloadDelay time.Duration

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// DirWatcher reloads a CA directory when it changes, without a restart:
// a rotated intermediate or a root added for a rotation is in use within
// ReloadDelay. A broken update (a missing file, a key that does not match,
// an expired certificate) is logged and counted, and the bundle in use
// stays until the directory holds a valid one again.
type DirWatcher struct {
	cfg     DirWatcherConfig
	log     *slog.Logger
	reloads *prometheus.CounterVec
}

// NewDirWatcher validates cfg and applies its defaults. It starts nothing.
func NewDirWatcher(cfg DirWatcherConfig) (*DirWatcher, error) {
	if cfg.Dir == "" {
		return nil, errors.New("keystore: DirWatcher needs a directory")
	}
	if cfg.Target == nil {
		return nil, errors.New("keystore: DirWatcher needs a Target")
	}
	if cfg.ReloadDelay < 0 {
		return nil, fmt.Errorf("keystore: negative reload delay %s", cfg.ReloadDelay)
	}
	cfg.ReloadDelay = cmp.Or(cfg.ReloadDelay, DefaultDirReloadDelay)
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	w := &DirWatcher{
		cfg: cfg,
		log: cfg.Logger.With(logs.KeyDir, cfg.Dir),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_dir_reloads_total",
			Help: "Reloads of the plugged-in CA directory (--ca-dir) after a change, by result: applied, unchanged, failed (the previous CA stays in use).",
		}, []string{"result"}),
	}
	for _, r := range []string{ReloadApplied, ReloadUnchanged, ReloadFailed} {
		w.reloads.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(w.reloads); err != nil {
			return nil, fmt.Errorf("keystore: metrics: %w", err)
		}
	}
	return w, nil
}

// Run watches the directory until ctx ends. It reloads once when the watch
// is in place, so that a change made between loading the CA and Run is not
// missed. It returns an error only if the directory cannot be watched.
func (w *DirWatcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("keystore: watching %s: %w", w.cfg.Dir, err)
	}
	defer fw.Close()
	// The directory, not the files: the kubelet replaces ..data, and an
	// editor or `mv` replaces a file, and a watch on the old inode would
	// see neither.
	if err := fw.Add(w.cfg.Dir); err != nil {
		return fmt.Errorf("keystore: watching %s: %w", w.cfg.Dir, err)
	}
	w.log.Info("watching the CA directory for changes")
	w.reload()

	timer := w.cfg.Clock.NewTimer(w.cfg.ReloadDelay)
	timer.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if !relevant(ev) || pending {
				continue
			}
			// The delay runs from the first change, not the last: a
			// directory changing without pause is still reloaded once per
			// delay.
			pending = true
			timer.Reset(w.cfg.ReloadDelay)
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			// Events were lost (queue overflow): the directory may have
			// changed, so reload as for a change.
			w.log.Warn("CA directory watch error; reloading in case a change was missed", logs.KeyError, err)
			if !pending {
				pending = true
				timer.Reset(w.cfg.ReloadDelay)
			}
		case <-timer.C():
			pending = false
			w.reload()
		}
	}
}

// relevant reports whether ev can change the CA: the kubelet's ..data
// swap, or a CA file itself created, written, renamed or removed.
func relevant(ev fsnotify.Event) bool {
	if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Write) && !ev.Has(fsnotify.Rename) && !ev.Has(fsnotify.Remove) {
		return false
	}
	switch filepath.Base(ev.Name) {
	case dataLink, CACertFile, CAKeyFile, CertChainFile, RootCertFile, TLSCertFile, TLSKeyFile, TLSCAFile:
		return true
	}
	return false
}

// reload loads the directory and, when it holds a valid bundle other than
// the one in use, hands it to the Target.
func (w *DirWatcher) reload() {
	var (
		b   *Bundle
		err error
	)
	now := w.cfg.Clock.Now()
	if w.cfg.Key != nil {
		b, err = LoadDirSigner(w.cfg.Dir, w.cfg.Key, now)
	} else {
		b, err = LoadDir(w.cfg.Dir, now)
	}
	if err == nil && sameBundle(b, w.cfg.Target.Bundle()) {
		w.reloads.WithLabelValues(ReloadUnchanged).Inc()
		w.log.Debug("CA directory unchanged")
		return
	}
	if err == nil {
		err = w.cfg.Target.SetBundle(b)
	} else if r, ok := w.cfg.Target.(refuser); ok {
		r.Refuse(err) // a rotation records that a new CA is stuck
	}
	if err != nil {
		// Errors name the file at fault and never hold key bytes.
		w.reloads.WithLabelValues(ReloadFailed).Inc()
		w.log.Error("CA directory update refused; the previous CA stays in use", logs.KeyError, err)
		return
	}
	w.reloads.WithLabelValues(ReloadApplied).Inc()
	w.log.Info("CA directory reloaded",
		logs.KeySubject, b.Cert.Subject.String(),
		logs.KeyNotAfter, b.Cert.NotAfter,
		logs.KeyRoots, len(b.Roots))
}

// sameBundle reports whether a and b hold the same certificates (the key
// is bound to the signing certificate, so it cannot differ alone).
func sameBundle(a, b *Bundle) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cert.Equal(b.Cert) && sameCerts(a.Intermediates, b.Intermediates) && sameCerts(a.Roots, b.Roots)
}
