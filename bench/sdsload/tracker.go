package sdsload

import (
	"hash/maphash"
	"sync"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// tracker holds every stream's state under one lock: updates are rare (one
// per response) compared with the work of receiving them.
type tracker struct {
	mu         sync.Mutex
	n          int
	phase      Phase
	phaseStart time.Time

	isReadyS []bool
	dead     []bool
	failed   int
	open     wave     // every stream's first content
	phases   []phases // of the ready streams, by stream

	fp    []uint64 // current content of the rotation resource per stream
	armed bool
	rotT0 time.Time
	base  []uint64
	inRot []bool // part of the rotation and not yet rotated or failed
	rot   wave   // the ready streams' new content, once armed
}

func newTracker(n int, now time.Time) *tracker {
	return &tracker{
		n: n, phase: PhaseOpen, phaseStart: now,
		isReadyS: make([]bool, n), dead: make([]bool, n), fp: make([]uint64, n),
		open: newWave(n), rot: newWave(0), phases: make([]phases, n),
	}
}

// wave is one phase of the run as the streams reach it: the streams it
// waits for (want), those that reached it (with the latency of each and
// the time of the last) and those done (reached it, or failed first). all
// is closed when every stream is done.
type wave struct {
	want    int
	reached int
	done    int
	lat     []time.Duration
	last    time.Time
	all     chan struct{}
}

func newWave(want int) wave {
	return wave{want: want, lat: make([]time.Duration, 0, want), all: make(chan struct{})}
}

// reach counts a stream reaching the wave after d, at now.
func (w *wave) reach(d time.Duration, now time.Time) {
	w.reached++
	w.lat = append(w.lat, d)
	if now.After(w.last) {
		w.last = now
	}
	w.finish()
}

// finish counts a stream done with the wave.
func (w *wave) finish() {
	w.done++
	if w.done == w.want {
		close(w.all)
	}
}

var seed = maphash.MakeSeed()

// fingerprint identifies a secret's content: the certificate chain of a TLS
// certificate, the trusted CAs of a validation context, else the whole
// encoded resource.
func fingerprint(s *tlsv3.Secret, encoded []byte) uint64 {
	if c := s.GetTlsCertificate(); c != nil {
		return maphash.Bytes(seed, c.GetCertificateChain().GetInlineBytes())
	}
	if v := s.GetValidationContext(); v != nil {
		return maphash.Bytes(seed, v.GetTrustedCa().GetInlineBytes())
	}
	return maphash.Bytes(seed, encoded)
}

func (t *tracker) readyAt(i int, d time.Duration, now time.Time, ph phases) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isReadyS[i] {
		return
	}
	ph.ready = now
	t.phases[i] = ph
	t.isReadyS[i] = true
	t.open.reach(d, now)
}

func (t *tracker) fail(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed++
	t.dead[i] = true
	if !t.isReadyS[i] {
		t.open.finish()
	}
	if t.armed && t.inRot[i] {
		t.inRot[i] = false
		t.rot.finish()
	}
}

func (t *tracker) content(i int, fp uint64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fp[i] = fp
	if t.armed && t.inRot[i] && fp != t.base[i] {
		t.inRot[i] = false
		t.rot.reach(now.Sub(t.rotT0), now)
	}
}

// arm starts the rotation phase: every ready stream must now receive content
// other than what it holds.
func (t *tracker) arm(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.phase, t.phaseStart = PhaseRotate, now
	t.armed, t.rotT0 = true, now
	t.base = append([]uint64(nil), t.fp...)
	t.inRot = make([]bool, t.n)
	n := 0
	for i, r := range t.isReadyS {
		if r && !t.dead[i] {
			t.inRot[i] = true
			n++
		}
	}
	t.rot = newWave(n)
	if n == 0 {
		close(t.rot.all)
	}
}
