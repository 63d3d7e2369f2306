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

	isReadyS  []bool
	dead      []bool
	ready     int
	failed    int
	openDone  int // streams ready or failed before being ready
	readyLat  []time.Duration
	phases    []phases // of the ready streams, by stream
	lastReady time.Time
	allReady  chan struct{}

	fp         []uint64 // current content of the rotation resource per stream
	armed      bool
	rotT0      time.Time
	base       []uint64
	inRot      []bool // part of the rotation and not yet rotated or failed
	rotN       int
	rotated    int
	rotDone    int // rotated or failed
	rotLat     []time.Duration
	lastRot    time.Time
	allRotated chan struct{}
}

func newTracker(n int, now time.Time) *tracker {
	return &tracker{
		n: n, phase: PhaseOpen, phaseStart: now,
		isReadyS: make([]bool, n), dead: make([]bool, n), fp: make([]uint64, n),
		readyLat: make([]time.Duration, 0, n), phases: make([]phases, n),
		allReady: make(chan struct{}), allRotated: make(chan struct{}),
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
	t.ready++
	t.readyLat = append(t.readyLat, d)
	if now.After(t.lastReady) {
		t.lastReady = now
	}
	t.openDoneLocked()
}

func (t *tracker) openDoneLocked() {
	t.openDone++
	if t.openDone == t.n {
		close(t.allReady)
	}
}

func (t *tracker) fail(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed++
	t.dead[i] = true
	if !t.isReadyS[i] {
		t.openDoneLocked()
	}
	if t.armed && t.inRot[i] {
		t.inRot[i] = false
		t.rotDoneLocked()
	}
}

func (t *tracker) content(i int, fp uint64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fp[i] = fp
	if t.armed && t.inRot[i] && fp != t.base[i] {
		t.inRot[i] = false
		t.rotated++
		t.rotLat = append(t.rotLat, now.Sub(t.rotT0))
		if now.After(t.lastRot) {
			t.lastRot = now
		}
		t.rotDoneLocked()
	}
}

func (t *tracker) rotDoneLocked() {
	t.rotDone++
	if t.rotDone == t.rotN {
		close(t.allRotated)
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
	for i, r := range t.isReadyS {
		if r && !t.dead[i] {
			t.inRot[i] = true
			t.rotN++
		}
	}
	t.rotLat = make([]time.Duration, 0, t.rotN)
	if t.rotN == 0 {
		close(t.allRotated)
	}
}
