package secretcache

import (
	"context"
	"errors"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Run watches the mounted files and runs the rotation scheduler until ctx is
// done. It renews the workload certificate at its renewal time and retries
// CA failures with backoff. Run does not fetch the first certificate by
// itself: the first Secret (or Rotate) call does, and a failure there is
// retried here. Run returns nil when ctx ends; it may run only once at a time.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return errors.New("secretcache: Run called twice")
	}
	m.running = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
	}()

	done := make(chan struct{})
	go func() {
		defer close(done)
		m.runFiles(ctx)
	}()
	jwtDone := make(chan struct{})
	go func() {
		defer close(jwtDone)
		if m.jwt != nil {
			m.jwt.run(ctx)
		}
	}()
	rootsDone := make(chan struct{})
	go func() {
		defer close(rootsDone)
		if m.rootFile != "" {
			m.refreshRoots(ctx)
		}
	}()
	fedDone := make(chan struct{})
	go func() {
		defer close(fedDone)
		m.runFederation(ctx)
	}()
	m.schedule(ctx)
	<-fedDone
	<-done
	<-jwtDone
	<-rootsDone
	return nil
}

// runFiles watches the directories of the file-mounted secrets until ctx is
// done. The fsnotify watcher is created only once a file secret is in use:
// it holds an inotify instance, of which a user may have only a few hundred
// (fs.inotify.max_user_instances, often 128), and an agent serving only
// default and ROOTCA, or a process with many Managers, needs none. If it
// cannot be created, file secrets are still served, but changes to their
// files are not pushed; the failure is logged and counted.
func (m *Manager) runFiles(ctx context.Context) {
	m.mu.Lock()
	known := len(m.byDir) > 0
	m.mu.Unlock()
	if !known {
		select {
		case <-ctx.Done():
			return
		case <-m.wantFiles:
		}
	}
	w, err := m.startWatcher()
	if err != nil {
		m.metrics.fileFailures.Inc()
		m.log.Warn("cannot watch mounted files; changes to them will not be pushed", logs.KeyError, err)
		return
	}
	m.watchFiles(ctx, w)
	m.stopWatcher(w)
}

// schedule is the rotation loop. It parks on one clock timer set to the
// next renewal or retry time, and recomputes after every state change.
func (m *Manager) schedule(ctx context.Context) {
	for {
		// Drain a pending wake-up first: the state read below already
		// reflects it.
		select {
		case <-m.kick:
		default:
		}
		wake, ok := m.nextWake()
		var (
			timer clock.Timer
			fire  <-chan time.Time
		)
		if ok {
			timer = m.clock.NewTimer(wake.Sub(m.clock.Now()))
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-m.kick:
			if timer != nil {
				timer.Stop()
			}
		case <-fire:
			// Errors are logged, counted and scheduled for retry by fly.
			_, _ = m.obtain(ctx, true)
		}
	}
}

// nextWake returns when the scheduler must act: the retry time while backing
// off, else the renewal time of the current certificate. There is nothing to
// wait for before the first certificate was requested.
func (m *Manager) nextWake() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.inflight != nil:
		return time.Time{}, false // fly wakes us when it is done
	case !m.retryAt.IsZero():
		return m.retryAt, true
	case m.cert.Load() != nil:
		return m.renewAt, true
	}
	return time.Time{}, false
}
