package e2e_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

// mountConfigMap keeps file equal to ns's root ConfigMap, as the kubelet
// keeps a mounted ConfigMap, and reports every distinct content seen.
func mountConfigMap(t *testing.T, ns, file string) <-chan []*x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := cluster.Client().CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", rootConfigMap).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan []*x509.Certificate, 64)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			data := []byte(cm.Data["root-cert.pem"])
			roots, err := certs.ParseCertificates(data)
			if err != nil {
				continue
			}
			if err := os.WriteFile(file+".tmp", data, 0o644); err == nil {
				_ = os.Rename(file+".tmp", file)
			}
			select {
			case seen <- roots:
			default:
			}
		}
	}()
	return seen
}

// rotationRecord reads the rotation state the leader keeps in the cluster.
func rotationRecord(ctx context.Context) (rotation.Record, error) {
	var rec rotation.Record
	s, err := cluster.Client().CoreV1().Secrets(caNamespace).Get(ctx, caserver.RotationStateSecret, metav1.GetOptions{})
	if err != nil {
		return rec, err
	}
	return rec, json.Unmarshal(s.Data["rotation.json"], &rec)
}

// writeCacerts creates the cacerts Secret with files, or replaces its
// files (the operator's rotation).
func writeCacerts(t *testing.T, files map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	secrets := cluster.Client().CoreV1().Secrets(caNamespace)
	sec, err := secrets.Get(ctx, pluggedSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pluggedSecret, Namespace: caNamespace}, Data: files}, metav1.CreateOptions{})
	} else if err == nil {
		sec.Data = files
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// bothActivateAt reports whether every replica's next step is the
// activation at at (meshid_ca_rotation_next_step_timestamp_seconds).
func bothActivateAt(replicas []*caServer, at time.Time) bool {
	for _, r := range replicas {
		v, err := metricSum(r.monitor, "meshid_ca_rotation_next_step_timestamp_seconds")
		if err != nil || int64(v) != at.Unix() {
			return false
		}
	}
	return true
}

// startKubeAgent runs `meshid agent` for sa's pod against ca, reading its
// --ca-root from the mounted root ConfigMap, and follows its SDS stream.
func startKubeAgent(t *testing.T, ca *caServer, pod *corev1.Pod, caRoot, ttl string) *testkit.SDSProxy {
	t.Helper()
	ctx := context.Background()
	ns, sa := pod.Namespace, pod.Spec.ServiceAccountName
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: ns, ServiceAccount: sa, Audiences: []string{"istio-ca"}, Pod: pod, Expiration: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := testkit.ShortDir(t)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	monitor, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sds.sock")
	runMeshid(t, "meshid-agent-"+sa, dir, monitor, "agent",
		"--ca-addr", ca.addr, "--ca-root", caRoot, "--ca-root-refresh", "2s",
		"--token-file", tokenFile, "--sds-socket", sock, "--cert-ttl", ttl,
		"--monitoring-listen", monitor, "--trust-domain", trustDomain.Name())
	return testkit.FollowSDS(t, sock, workloadID(ns, sa))
}

// Issue 13 on the real API server: two `meshid server --kube-ca-secret`
// replicas (leader election) with the CA in the cacerts Secret, two agents
// with 20 s certificates, each on its own replica, reading --ca-root from
// the mounted istio-ca-root-cert ConfigMap, and an mTLS client and server
// between their identities (go-spiffe tlsconfig, with what Envoy would
// hold from SDS) handshaking continuously. The cacerts Secret is replaced
// with a new root. Required: no handshake fails until the old root is
// retired; both replicas keep the leader's clock; the ConfigMap holds the
// union, then the new root alone; both leaves chain to the new root.
func TestKubeCARotationZeroFailedHandshakes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about two minutes")
	}
	ctx := context.Background()
	kubeconfig := deployRBAC(t)
	resetCAState(t)
	t.Cleanup(func() { resetCAState(t) })
	oldFiles, _, oldRoot := testkit.Plugged(t, "operator")
	writeCacerts(t, oldFiles)

	// Leaves live 20 s; a new root signs 10 s after it is trusted (five
	// --ca-root re-reads); the old root retires 20 s + 1 min after.
	const ttl = "20s"
	flags := []string{"--kube-ca-secret", "--namespace", caNamespace, "--rotation-propagation", "10s", "--default-ttl", ttl, "--max-ttl", ttl}
	replicas := []*caServer{
		startCA(t, kubeconfig, append(flags, "--pod-name", "ca-0")...),
		startCA(t, kubeconfig, append(flags, "--pod-name", "ca-1")...),
	}
	const ns = "kube-ca-rotation"
	w := newWorkload(t, ns)
	eventually(t, 30*time.Second, "the root ConfigMap holds the old root", func(ctx context.Context) error {
		return configMapHolds(ctx, ns, []*x509.Certificate{oldRoot})
	})
	caRoot := filepath.Join(testkit.ShortDir(t), "root-cert.pem")
	published := mountConfigMap(t, ns, caRoot)
	select {
	case <-published: // the file exists
	case <-time.After(testkit.Guard):
		t.Fatal("the root ConfigMap was not seen")
	}
	otherPod, err := cluster.CreatePod(ctx, ns, "other-0", "other")
	if err != nil {
		t.Fatal(err)
	}
	hs := &testkit.Handshakes{Server: startKubeAgent(t, replicas[0], w.pod, caRoot, ttl), Client: startKubeAgent(t, replicas[1], otherPod, caRoot, ttl)}

	newFiles, _, newRoot := testkit.Plugged(t, "operator")
	var (
		phases             = map[string]bool{}
		unionSeen, rotated bool
		oneClock           bool // both replicas seen waiting for the leader's activation time
		activateAt         = map[string]bool{}
	)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(4 * time.Minute)
	for i := 0; ; i++ {
		hs.Try(t, fmt.Sprintf("phases %v", phases))
		if !rotated && hs.N >= 20 {
			writeCacerts(t, newFiles) // the rotation: cacerts replaced
			rotated = true
		}
	drain:
		for {
			select {
			case roots := <-published:
				unionSeen = unionSeen || sameSet(roots, []*x509.Certificate{oldRoot, newRoot})
			default:
				break drain
			}
		}
		if i%10 == 0 && rotated {
			rec, err := rotationRecord(ctx)
			if err == nil {
				phases[rec.Phase] = true
				if rec.Phase == "prepared" {
					activateAt[rec.ActivateAt.String()] = true
					oneClock = oneClock || bothActivateAt(replicas, rec.ActivateAt)
				}
			}
			if err == nil && phases["prepared"] && phases["active"] && rec.Phase == "stable" && unionSeen &&
				configMapHolds(ctx, ns, []*x509.Certificate{newRoot}) == nil &&
				hs.OnlyOn(newRoot) {
				break
			}
		}
		if time.Now().After(deadline) {
			rec, _ := rotationRecord(ctx)
			t.Fatalf("rotation did not finish in time: phases %v, union seen %v, state %+v; %v", phases, unionSeen, rec, hs)
		}
		<-tick.C
	}
	if hs.Failed != 0 {
		t.Fatal(hs)
	}
	if len(activateAt) != 1 || !oneClock {
		t.Fatalf("the shared state named %d activation times %v (want one), replicas seen on it: %v", len(activateAt), activateAt, oneClock)
	}
	if hs.Client.Workload().OnlyOn(oldRoot) || hs.Server.Workload().OnlyOn(oldRoot) {
		t.Fatal("a proxy is still on the old root")
	}
	t.Logf("%v; phases %v", hs, phases)
}
