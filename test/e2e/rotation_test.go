package e2e_test

import (
	"crypto"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// parked waits until the agent's rotation scheduler waits on the fake
// clock (the only component of a world that sets fake timers) and returns
// when it will wake.
func parked(t *testing.T, f *clock.Fake) time.Time {
	t.Helper()
	return testkit.NextDeadline(t, f, "the rotation scheduler's timer")
}

// Issue 3, done when: with the clock advanced, the client gets a new
// certificate before the old one expires. The CA, the CA client, the
// SecretManager and the SDS server all run on one fake clock; the SDS
// client is go-control-plane's, on the agent's Unix socket.
func TestRotationPushedBeforeExpiry(t *testing.T) {
	w := newWorld(t, true)
	ca := w.startCA(t, "127.0.0.1:0")
	const ttl = time.Hour
	a := w.startAgent(t, ca.addr, "shop", "cart", ttl)

	s := openSotw(t, a.sds, "default", "ROOTCA")
	got := s.recvNames("default", "ROOTCA")
	bundle := bundleOf(t, got["ROOTCA"])
	cur := svidOf(t, got["default"])
	verifySVID(t, cur, bundle, w.fake.Now(), a.id)

	const rotations = 3
	for i := range rotations {
		old := cur.Certificates[0]
		lifetime := old.NotAfter.Sub(old.NotBefore)
		at := parked(t, w.fake)
		// Renewal at NotBefore + 0.5 × lifetime, ±1% jitter.
		if want := old.NotBefore.Add(lifetime / 2); at.Sub(want).Abs() > lifetime/100+time.Second {
			t.Fatalf("rotation %d scheduled at %v, want %v ± 1%% of %v", i+1, at, want, lifetime)
		}
		w.fake.Set(at)

		secs := s.recv()
		now := w.fake.Now()
		if len(secs) != 1 || secs[0].GetName() != "default" {
			t.Fatalf("rotation %d pushed %d secrets (%q), want default", i+1, len(secs), secretNames(secs))
		}
		if !now.Before(old.NotAfter) {
			t.Fatalf("rotation %d pushed at %v, not before the old certificate's NotAfter %v", i+1, now, old.NotAfter)
		}
		cur = svidOf(t, secs[0])
		leaf := cur.Certificates[0]
		verifySVID(t, cur, bundle, now, a.id)
		if leaf.SerialNumber.Cmp(old.SerialNumber) == 0 || !leaf.NotAfter.After(old.NotAfter) {
			t.Fatalf("rotation %d: serial %x NotAfter %v after serial %x NotAfter %v", i+1, leaf.SerialNumber, leaf.NotAfter, old.SerialNumber, old.NotAfter)
		}
		if leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(old.PublicKey) {
			t.Fatalf("rotation %d kept the old key", i+1)
		}
	}
	if n := counter(t, a.reg, "meshid_agent_rotations_total"); n != 1+rotations {
		t.Fatalf("meshid_agent_rotations_total = %v, want %d", n, 1+rotations)
	}
	if n := counter(t, a.reg, "meshid_agent_rotation_failures_total"); n != 0 {
		t.Fatalf("%v CA failures while the CA was up", n)
	}
}
