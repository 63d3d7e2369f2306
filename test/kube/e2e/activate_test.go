package e2e_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/testkit"
)

// activationWait bounds how long an activation may take to reach a
// replica: seconds, against the hour of --rotation-propagation it skips.
const activationWait = 30 * time.Second

// preparedPair is two `meshid server --kube-ca-secret` replicas, each with
// its --admin-socket, that have both prepared the new CA of a replaced
// cacerts Secret and would sign with it only after an hour.
type preparedPair struct {
	leader, follower *caServer
	sockets          map[*caServer]string
	bin              string // meshid
	oldCA, oldRoot   *x509.Certificate
	newCA, newRoot   *x509.Certificate
	token            string
	id               spiffeid.ID
}

func newPreparedPair(t *testing.T, ns string) *preparedPair {
	t.Helper()
	kubeconfig := deployRBAC(t)
	resetCAState(t)
	t.Cleanup(func() { resetCAState(t) })
	oldFiles, oldCA, oldRoot := testkit.Plugged(t, "operator")
	newFiles, newCA, newRoot := testkit.Plugged(t, "next")
	p := &preparedPair{sockets: map[*caServer]string{}, bin: meshid(t), oldCA: oldCA, oldRoot: oldRoot, newCA: newCA, newRoot: newRoot}
	writeCacerts(t, oldFiles)
	dir := testkit.ShortDir(t) // a Unix socket's path is short
	byPod := map[string]*caServer{}
	for _, pod := range []string{ns + "-0", ns + "-1"} {
		sock := filepath.Join(dir, pod+".sock")
		r := startCA(t, kubeconfig, "--kube-ca-secret", "--namespace", caNamespace, "--pod-name", pod,
			"--rotation-propagation", "1h", "--admin-socket", sock,
			"--root-configmap-namespaces", publishLabel+"="+ns) // no namespace: the ConfigMaps are not under test
		r.connect(t, []*x509.Certificate{oldRoot, newRoot})
		byPod[pod], p.sockets[r] = r, sock
	}
	w := newWorkload(t, ns)
	p.token, p.id = w.token(t, "istio-ca"), workloadID(ns, w.sa)
	for pod, r := range byPod {
		eventually(t, time.Minute, pod+" signs under the old CA", func(ctx context.Context) error {
			return signsUnder(ctx, r, p.token, p.id, []*x509.Certificate{oldRoot}, oldCA)
		})
	}

	writeCacerts(t, newFiles) // the rotation: cacerts replaced
	for pod, r := range byPod {
		eventually(t, time.Minute, pod+" prepared the new CA", func(ctx context.Context) error {
			return p.holds(ctx, r, "prepared", p.oldCA, p.oldRoot)
		})
	}
	eventually(t, time.Minute, "one replica leads, the holder of the Lease meshid-ca", func(ctx context.Context) error {
		leader, err := gaugeLeader(ctx, byPod, "meshid-ca", "meshid_ca_leader")
		if err != nil {
			return err
		}
		for pod, r := range byPod {
			if pod == leader {
				p.leader = r
			} else {
				p.follower = r
			}
		}
		return nil
	})
	return p
}

// certs runs `meshid certs sub --admin-socket <r's> -o json`, the command
// an operator runs, and returns the status it prints.
func (p *preparedPair) certs(ctx context.Context, r *caServer, sub string) (admin.Status, error) {
	var st admin.Status
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, p.bin, "certs", sub, "--admin-socket", p.sockets[r], "-o", "json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return st, fmt.Errorf("meshid certs %s: %w: %s", sub, err, stderr.Bytes())
	}
	return st, json.Unmarshal(stdout.Bytes(), &st)
}

// holds checks that r's rotation is in phase, signing with signer, by
// `meshid certs status`, and that a CSR to r returns a leaf of signer
// that chains to root.
func (p *preparedPair) holds(ctx context.Context, r *caServer, phase string, signer, root *x509.Certificate) error {
	st, err := p.certs(ctx, r, "status")
	if err != nil {
		return err
	}
	if st.Phase != phase || st.Signing == nil || st.Signing.Serial != signer.SerialNumber.Text(16) {
		return fmt.Errorf("phase %q signing %+v, want %q signing %s", st.Phase, st.Signing, phase, signer.Subject)
	}
	return signsUnder(ctx, r, p.token, p.id, []*x509.Certificate{root}, signer)
}

// activate runs `meshid certs activate` on r and checks its answer: r
// signs with the new CA.
func (p *preparedPair) activate(t *testing.T, r *caServer) {
	t.Helper()
	st, err := p.certs(context.Background(), r, "activate")
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != "active" || st.Signing == nil || st.Signing.Serial != p.newCA.SerialNumber.Text(16) {
		t.Fatalf("meshid certs activate: phase %q signing %+v, want active with %s", st.Phase, st.Signing, p.newCA.Subject)
	}
}

// TestKubeCAActivateOnLeader: two --kube-ca-secret replicas have prepared a
// new CA that would sign after --rotation-propagation (1h); `meshid certs
// activate` on the leader alone (the replica whose meshid_ca_leader is 1,
// the meshid-ca Lease's holder) makes both sign with it within seconds:
// both report phase active with the new CA, and a CSR to each returns a
// leaf of the new CA chaining to the new root (docs/rotation.md).
func TestKubeCAActivateOnLeader(t *testing.T) {
	p := newPreparedPair(t, "activate-leader")
	start := time.Now()
	p.activate(t, p.leader)
	for name, r := range map[string]*caServer{"the leader": p.leader, "the follower": p.follower} {
		eventually(t, activationWait, name+" signs with the new CA", func(ctx context.Context) error {
			return p.holds(ctx, r, "active", p.newCA, p.newRoot)
		})
	}
	rec, err := rotationRecord(context.Background())
	if err != nil || rec.Phase != "active" {
		t.Errorf("the shared record: phase %q (%v), want active", rec.Phase, err)
	}
	t.Logf("both replicas active %s after the leader's activation", time.Since(start).Round(time.Millisecond))
}

// TestKubeCAActivateOnFollower: the same `meshid certs activate` on the
// replica that does not lead activates that replica only: only the leader
// writes the shared record, so the leader stays prepared and signs with
// the old CA, and the record still says prepared.
func TestKubeCAActivateOnFollower(t *testing.T) {
	p := newPreparedPair(t, "activate-follower")
	p.activate(t, p.follower)
	eventually(t, activationWait, "the follower signs with the new CA", func(ctx context.Context) error {
		return p.holds(ctx, p.follower, "active", p.newCA, p.newRoot)
	})
	ctx := context.Background()
	if err := p.holds(ctx, p.leader, "prepared", p.oldCA, p.oldRoot); err != nil {
		t.Errorf("the leader after the follower's activation: %v", err)
	}
	if rec, err := rotationRecord(ctx); err != nil || rec.Phase != "prepared" {
		t.Errorf("the shared record: phase %q (%v), want prepared", rec.Phase, err)
	}
}
