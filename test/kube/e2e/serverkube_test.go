package e2e_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// These tests run the real `meshid server` binary with its own flags
// (issue 19's rule) against the real API server, for the wiring of issue
// 17: whenever the server has a Kubernetes client it elects a leader that
// publishes istio-ca-root-cert, whatever holds the key.

// mountedSecret is a directory the way the kubelet keeps a Secret volume:
// the files live in a timestamped directory, ..data points at it, and each
// visible name is a symbolic link through ..data. update is the kubelet's
// atomic writer: a new timestamped directory, a ..data_tmp link to it
// renamed over ..data, the old directory removed.
type mountedSecret struct {
	dir string
	gen int
	cur string
}

func newMountedSecret(t *testing.T, files map[string][]byte) *mountedSecret {
	t.Helper()
	m := &mountedSecret{dir: t.TempDir()}
	m.update(t, files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func (m *mountedSecret) update(t *testing.T, files map[string][]byte) {
	t.Helper()
	m.gen++
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), m.gen)
	if err := os.Mkdir(filepath.Join(m.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(m.dir, ts, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(m.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(m.dir, "..data_tmp"), filepath.Join(m.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if m.cur != "" {
		if err := os.RemoveAll(filepath.Join(m.dir, m.cur)); err != nil {
			t.Fatal(err)
		}
	}
	m.cur = ts
}

// metricSum adds every sample of name, whatever its labels, on a /metrics
// page; it fails when name is not exposed.
func metricSum(monitor, name string) (float64, error) {
	resp, err := http.Get("http://" + monitor + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var (
		sum   float64
		found bool
	)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest == "" || (rest[0] != ' ' && rest[0] != '{')) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, err
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("metric %s not exposed", name)
	}
	return sum, nil
}

// readyz returns /readyz's status code and body.
func readyz(monitor string) (int, string, error) {
	resp, err := http.Get("http://" + monitor + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(body), err
}

// TestServerPublishesRoot runs two `meshid server --kubeconfig` replicas
// (distinct --pod-name) as the meshid ServiceAccount of deploy/, for each
// key source that is not a Secret: a self-signed --state-dir root and a
// plugged --ca-dir (a kubelet-style cacerts mount made by `meshid certs`'s
// library). One replica leads and alone writes the ConfigMaps: they appear
// in existing and new selected namespaces, never in one the selector
// leaves out, are repaired after deletion and edit; the leader's /readyz
// reports a namespace it cannot write to, and recovers. With --ca-dir, a
// new root swapped into the mount reaches the ConfigMaps without a restart.
func TestServerPublishesRoot(t *testing.T) {
	kubeconfig := deployRBAC(t)
	for _, source := range []string{"state-dir", "ca-dir"} {
		t.Run(source, func(t *testing.T) {
			ctx := context.Background()
			resetCAState(t)
			run := "bin-" + source
			existing := "binpub-" + source + "-existing"
			labelledNamespace(t, existing, run)
			unselected := "binpub-" + source + "-other"
			labelledNamespace(t, unselected, "someone-else")

			args := []string{"--namespace", caNamespace, "--root-configmap-namespaces", publishLabel + "=" + run}
			var (
				roots   []*x509.Certificate
				mounted *mountedSecret
			)
			switch source {
			case "state-dir":
				// One root for both replicas: the state directory is shared.
				state := filepath.Join(t.TempDir(), "state")
				b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: state, TrustDomain: trustDomain.Name()})
				if err != nil {
					t.Fatal(err)
				}
				roots = b.Roots
				args = append(args, "--state-dir", state)
			case "ca-dir":
				files, _, root := testkit.Plugged(t, "operator")
				mounted = newMountedSecret(t, files)
				roots = []*x509.Certificate{root}
				args = append(args, "--ca-dir", mounted.dir)
			}
			replicas := map[string]*caServer{}
			for _, pod := range []string{run + "-0", run + "-1"} {
				replicas[pod] = startCA(t, kubeconfig, append(args, "--pod-name", pod)...)
			}
			const wait = time.Minute

			eventually(t, wait, "root in the existing namespace", func(ctx context.Context) error { return configMapHolds(ctx, existing, roots) })
			fresh := "binpub-" + source + "-new"
			labelledNamespace(t, fresh, run)
			eventually(t, wait, "root in a new namespace", func(ctx context.Context) error { return configMapHolds(ctx, fresh, roots) })

			expectRepaired(t, ctx, existing, roots, wait)

			// Two replicas, one publisher: the Lease holder.
			leader, err := leaseHolder(ctx)
			if err != nil || replicas[leader] == nil {
				t.Fatalf("lease holder %q (%v), want one of the replicas", leader, err)
			}
			for pod, r := range replicas {
				writes, err := metricSum(r.monitor, "meshid_ca_root_configmap_writes_total")
				if err != nil {
					t.Fatal(err)
				}
				if pod == leader && writes < 3 { // existing, fresh, the repair of the deletion
					t.Errorf("leader %s wrote %v ConfigMaps", pod, writes)
				}
				if pod != leader && writes != 0 {
					t.Errorf("follower %s wrote %v ConfigMaps", pod, writes)
				}
			}
			if _, err := cluster.Client().CoreV1().ConfigMaps(unselected).Get(ctx, rootConfigMap, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s, which --root-configmap-namespaces leaves out: %v", unselected, err)
			}

			if mounted != nil {
				// The operator rotates the cacerts Secret: the kubelet swaps
				// the mount, every replica reloads it, and the ConfigMaps
				// carry the new root with the old one.
				files, _, root2 := testkit.Plugged(t, "operator")
				next := []*x509.Certificate{root2, roots[0]}
				files[keystore.RootCertFile] = certs.EncodeCertificates(next...)
				mounted.update(t, files)
				for _, ns := range []string{existing, fresh} {
					eventually(t, wait, "the swapped root in "+ns, func(ctx context.Context) error { return configMapHolds(ctx, ns, next) })
				}
				for pod, r := range replicas {
					eventually(t, wait, pod+" counts the reload", func(context.Context) error {
						v, err := metricSum(r.monitor, `meshid_ca_dir_reloads_total{result="applied"}`)
						if err == nil && v != 1 {
							err = fmt.Errorf("applied reloads %v", v)
						}
						return err
					})
				}
				roots = next
			}

			// A namespace the leader cannot write to (an admission policy
			// refuses ConfigMaps there) makes the leader's /readyz fail,
			// naming it, after the 30 s grace; the follower stays ready.
			locked := "binpub-" + source + "-locked"
			lift := lockedNamespace(t, ctx, locked, run)
			eventually(t, rootpublisher.DefaultFailureGrace+wait, "the leader not ready", func(context.Context) error {
				code, body, err := readyz(replicas[leader].monitor)
				if err == nil && (code != http.StatusServiceUnavailable || !strings.Contains(body, locked)) {
					err = fmt.Errorf("/readyz %d %q", code, body)
				}
				return err
			})
			for pod, r := range replicas {
				if pod == leader {
					continue
				}
				if code, body, err := readyz(r.monitor); err != nil || code != http.StatusOK {
					t.Errorf("follower %s: /readyz %d %q %v", pod, code, body, err)
				}
			}
			lift()
			eventually(t, wait, "published after the policy is lifted", func(ctx context.Context) error {
				touchNamespace(t, locked)
				return configMapHolds(ctx, locked, roots)
			})
			eventually(t, wait, "the leader ready again", func(context.Context) error {
				code, body, err := readyz(replicas[leader].monitor)
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("/readyz %d %q", code, body)
				}
				return err
			})
		})
	}
}

// TestServerPublishRootConfigMapOff: `--publish-root-configmap=false` (a
// mesh where istiod still publishes) elects no leader and publishes
// nothing, though the server has a cluster and serves.
func TestServerPublishRootConfigMapOff(t *testing.T) {
	ctx := context.Background()
	kubeconfig := deployRBAC(t)
	resetCAState(t)
	run := "bin-off"
	ns := "binpub-off"
	labelledNamespace(t, ns, run)
	s := startCA(t, kubeconfig, "--namespace", caNamespace, "--pod-name", "off-0",
		"--root-configmap-namespaces", publishLabel+"="+run, "--publish-root-configmap=false")
	// The switch reached the server: its publisher and election do not
	// exist (they register their metrics when built, before any leading).
	for _, name := range []string{"meshid_ca_root_configmap_writes_total", "meshid_ca_leader"} {
		if _, err := metricSum(s.monitor, name); err == nil {
			t.Errorf("%s exposed with --publish-root-configmap=false", name)
		}
	}
	if _, err := cluster.Client().CoordinationV1().Leases(caNamespace).Get(ctx, "meshid-ca", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Lease meshid-ca: %v, want none", err)
	}
	if _, err := cluster.Client().CoreV1().ConfigMaps(ns).Get(ctx, rootConfigMap, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap in %s: %v, want none", ns, err)
	}
	// The same command without the switch does publish there.
	startCA(t, kubeconfig, "--namespace", caNamespace, "--pod-name", "on-0",
		"--root-configmap-namespaces", publishLabel+"="+run)
	eventually(t, time.Minute, "the root with the default --publish-root-configmap", func(ctx context.Context) error {
		_, err := cluster.Client().CoreV1().ConfigMaps(ns).Get(ctx, rootConfigMap, metav1.GetOptions{})
		return err
	})
}

// TestServerTrustedNodeAccounts: through the binary, --trusted-node-accounts
// lets a node agent's pod-bound token get a certificate for a pod on its
// own node, and not for one on another node; without the flag the same
// request is refused.
func TestServerTrustedNodeAccounts(t *testing.T) {
	ctx := context.Background()
	zt := scheduledPod(t, "istio-system", "ztunnel-bin", "ztunnel", "node-bin")
	scheduledPod(t, ambientNS, "web-bin", "web", "node-bin")
	scheduledPod(t, ambientNS, "db-bin-other", "db", "node-bin-other")
	ztTok := boundToken(t, zt)
	web, db := workloadID(ambientNS, "web"), workloadID(ambientNS, "db")
	// The admin kubeconfig can read pods (deploy/ambient's RBAC is tested
	// by TestNodeModeRBAC); no publisher, to leave the Lease alone.
	common := []string{"--publish-root-configmap=false"}

	on := startCA(t, cluster.AdminKubeconfig(), append(common, "--trusted-node-accounts", ztunnelAccount.Namespace+"/"+ztunnelAccount.Name)...)
	on.connect(t, on.stateRoots(t))
	a := &ambientCA{client: on.client}
	eventually(t, time.Minute, "impersonating the pod on the node agent's node", func(ctx context.Context) error {
		_, err := a.impersonate(ctx, ztTok, web, web)
		return err
	})
	chain, err := a.impersonate(ctx, ztTok, web, web)
	if err != nil {
		t.Fatal(err)
	}
	verifySVID(t, chain, on.roots, web)
	if _, err := a.impersonate(ctx, ztTok, db, db); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the pod on another node: %v, want PermissionDenied", err)
	}

	off := startCA(t, cluster.AdminKubeconfig(), common...)
	off.connect(t, off.stateRoots(t))
	b := &ambientCA{client: off.client}
	if _, err := b.impersonate(ctx, ztTok, web, web); status.Code(err) != codes.PermissionDenied {
		t.Errorf("without --trusted-node-accounts: %v, want PermissionDenied", err)
	}
	// The node agent's own identity still works there: only impersonation is off.
	if err := signsUnder(ctx, off, ztTok, workloadID("istio-system", "ztunnel"), off.roots, nil); err != nil {
		t.Errorf("the node agent's own certificate: %v", err)
	}
}
