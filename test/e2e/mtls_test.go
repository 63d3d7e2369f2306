package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/testkit"
)

func workloadOf(t *testing.T, a *agentProc) testkit.Workload {
	t.Helper()
	got := openSotw(t, a.sds, "default", "ROOTCA").recvNames("default", "ROOTCA")
	w := testkit.Workload{ID: a.id, SVID: svidOf(t, got["default"]), Bundle: bundleOf(t, got["ROOTCA"])}
	verifySVID(t, w.SVID, w.Bundle, time.Time{}, a.id)
	return w
}

// Issue 3: two identities from the agent stack complete an mTLS handshake
// with go-spiffe's tlsconfig authorizers, and a third identity is refused.
func TestMTLSBetweenAgentIdentities(t *testing.T) {
	w := newWorld(t, false)
	ca := w.startCA(t, "127.0.0.1:0")
	frontend := workloadOf(t, w.startAgent(t, ca.addr, "shop", "frontend", time.Hour))
	cart := workloadOf(t, w.startAgent(t, ca.addr, "shop", "cart", time.Hour))
	intruder := workloadOf(t, w.startAgent(t, ca.addr, "other", "intruder", time.Hour))

	t.Run("frontend to cart", func(t *testing.T) {
		serverErr, clientErr, sawClient, sawServer := testkit.Handshake(t, cart, frontend, frontend.ID, cart.ID)
		if serverErr != nil || clientErr != nil {
			t.Fatalf("server: %v; client: %v", serverErr, clientErr)
		}
		if sawClient != frontend.ID || sawServer != cart.ID {
			t.Fatalf("server saw %s, client saw %s", sawClient, sawServer)
		}
	})

	t.Run("cart refuses the intruder", func(t *testing.T) {
		serverErr, clientErr, _, _ := testkit.Handshake(t, cart, intruder, frontend.ID, cart.ID)
		if serverErr == nil || !strings.Contains(serverErr.Error(), intruder.ID.String()) {
			t.Fatalf("server accepted or failed for another reason: %v", serverErr)
		}
		if clientErr == nil {
			t.Fatal("the intruder's connection worked")
		}
	})

	t.Run("frontend refuses an intruder posing as cart", func(t *testing.T) {
		_, clientErr, _, _ := testkit.Handshake(t, intruder, frontend, frontend.ID, cart.ID)
		if clientErr == nil || !strings.Contains(clientErr.Error(), intruder.ID.String()) {
			t.Fatalf("client accepted or failed for another reason: %v", clientErr)
		}
	})
}
