package node_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The chart's pod certificate values in installMeshid.
const (
	podCertSigner = "meshid.io/workload"
	podCertBundle = "meshid.io:workload:roots" // the ClusterTrustBundle's name
	// podCertRefreshRatio puts status.beginRefreshAt at the API server's
	// earliest, notBefore+10m, instead of half the hour-long lifetime:
	// the refresh test then waits about 9 minutes for beginRefreshAt and
	// up to 7 more for the kubelet (it adds up to 5 minutes of jitter and
	// looks every 1-2 minutes), instead of half an hour.
	podCertRefreshRatio = "0.01"
	podCertNS           = "pcert"
	podCertVolume       = "identity"
)

// podCertRefreshes is held by TestPodCertificateThroughKubelet while it
// waits, in parallel with the other tests, for the kubelet's refresh;
// TestChartUninstallOnNode waits for it before it uninstalls the chart.
var podCertRefreshes sync.WaitGroup

// podCertPod is a pod with no agent and no service-account token: its
// identity comes from the podCertificate projected volume of meshid's
// signer (an hour-long ECDSA P-256 certificate) and its roots from a
// clusterTrustBundle volume selecting the signer's bundles; the probe
// prints the leaf's serial each time the file changes in the container.
func podCertPod(ns, name, sa string) *corev1.Pod {
	signer := podCertSigner
	hour := int32(3600)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: ptr(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "app", Image: probeRef, ImagePullPolicy: corev1.PullNever,
				Args:         []string{"watch", "/var/run/identity/credentialbundle.pem"},
				VolumeMounts: []corev1.VolumeMount{{Name: podCertVolume, MountPath: "/var/run/identity", ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Volumes: []corev1.Volume{{Name: podCertVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{
					{PodCertificate: &corev1.PodCertificateProjection{
						SignerName: podCertSigner, KeyType: "ECDSAP256", MaxExpirationSeconds: &hour,
						CredentialBundlePath: "credentialbundle.pem",
					}},
					{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{
						SignerName: &signer, LabelSelector: &metav1.LabelSelector{}, Path: "roots.pem",
					}},
				},
			}}}},
		},
	}
}

// credential is what the kubelet wrote into a pod's podCertificate
// volume, read on the node.
type credential struct {
	svid  *x509svid.SVID
	roots []*x509.Certificate
	// chainPEM and rootsPEM are the files' certificates, as written.
	chainPEM, rootsPEM []byte
}

func (c credential) serial() string { return c.svid.Certificates[0].SerialNumber.Text(16) }

// readCredential reads and checks the pod's credential bundle and roots
// from the kubelet's volume directory (the files bind-mounted into the
// container): the private key and chain parse as an X509-SVID of
// go-spiffe (the leaf is a valid SVID and matches the key), the SPIFFE ID
// is exactly want, and the chain verifies against the roots file.
func readCredential(t *testing.T, uid string, want spiffeid.ID) credential {
	t.Helper()
	dir := nd.ProjectedVolumeDir(uid, podCertVolume)
	bundle, err := os.ReadFile(filepath.Join(dir, "credentialbundle.pem"))
	if err != nil {
		t.Fatal(err)
	}
	rootsPEM, err := os.ReadFile(filepath.Join(dir, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	var keyPEM, chainPEM []byte
	for block, rest := pem.Decode(bundle); block != nil; block, rest = pem.Decode(rest) {
		switch block.Type {
		case "PRIVATE KEY":
			if keyPEM != nil {
				t.Fatal("the credential bundle holds two keys")
			}
			keyPEM = pem.EncodeToMemory(block)
		case "CERTIFICATE":
			chainPEM = append(chainPEM, pem.EncodeToMemory(block)...)
		default:
			t.Fatalf("the credential bundle holds a %q block", block.Type)
		}
	}
	svid, err := x509svid.Parse(chainPEM, keyPEM)
	if err != nil {
		t.Fatalf("go-spiffe refuses the credential bundle: %v", err)
	}
	leaf := svid.Certificates[0]
	if svid.ID != want || len(leaf.URIs) != 1 || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Errorf("leaf for %s (URIs %v, DNS %v, IPs %v), want exactly %s", svid.ID, leaf.URIs, leaf.DNSNames, leaf.IPAddresses, want)
	}
	roots, err := x509.ParseCertificates(pemDER(t, rootsPEM))
	if err != nil || len(roots) == 0 {
		t.Fatalf("roots.pem: %d roots, %v", len(roots), err)
	}
	id, _, err := x509svid.Verify(svid.Certificates, x509bundle.FromX509Authorities(want.TrustDomain(), roots))
	if err != nil || id != want {
		t.Fatalf("the chain does not verify against roots.pem: %v (id %s)", err, id)
	}
	return credential{svid: svid, roots: roots, chainPEM: chainPEM, rootsPEM: rootsPEM}
}

// leafSerial is the serial of the first certificate in a PEM bundle, or
// "" when there is none.
func leafSerial(data []byte) string {
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			if c, err := x509.ParseCertificate(block.Bytes); err == nil {
				return c.SerialNumber.Text(16)
			}
			return ""
		}
	}
	return ""
}

// pemDER concatenates the DER of every CERTIFICATE block of data.
func pemDER(t *testing.T, data []byte) []byte {
	t.Helper()
	var der []byte
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			t.Fatalf("a %q block among certificates", block.Type)
		}
		der = append(der, block.Bytes...)
	}
	return der
}

// sameCerts reports whether a and b hold the same certificates (PEM,
// order aside).
func sameCerts(t *testing.T, a, b []byte) bool {
	t.Helper()
	ca, err1 := x509.ParseCertificates(pemDER(t, a))
	cb, err2 := x509.ParseCertificates(pemDER(t, b))
	if err1 != nil || err2 != nil || len(ca) != len(cb) {
		return false
	}
	for _, c := range ca {
		if !slices.ContainsFunc(cb, func(d *x509.Certificate) bool { return d.Equal(c) }) {
			return false
		}
	}
	return true
}

// issuedPCR is the PodCertificateRequest whose issued chain is chainPEM,
// among the pod's.
func issuedPCR(t *testing.T, pod string, chainPEM []byte) *certificatesv1.PodCertificateRequest {
	t.Helper()
	list, err := cluster.Client().CertificatesV1().PodCertificateRequests(podCertNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i, pcr := range list.Items {
		if pcr.Spec.PodName != pod {
			continue
		}
		names = append(names, pcr.Name)
		if pcr.Spec.SignerName == podCertSigner && sameCerts(t, []byte(pcr.Status.CertificateChain), chainPEM) {
			return &list.Items[i]
		}
	}
	t.Fatalf("no PodCertificateRequest of pod %s issued the mounted chain (the pod's: %v)", pod, names)
	return nil
}

// TestPodCertificateThroughKubelet: the chart installed with
// podCertificates.signerName; a pod with a podCertificate volume for
// meshid's signer and a clusterTrustBundle volume (no agent, no token)
// starts with a credential bundle meshid signed (its audit line names the
// serial) for exactly the pod's SPIFFE ID, with the key the kubelet made;
// the chain verifies against the mounted roots, which are the
// ClusterTrustBundle's and the root ConfigMap's; the container sees the
// same leaf. Then, in parallel with the rest of the suite, the kubelet
// refreshes it: a new PodCertificateRequest, created at or after the
// first one's status.beginRefreshAt, and a new certificate and key in the
// container.
func TestPodCertificateThroughKubelet(t *testing.T) {
	need(t)
	installMeshid(t)
	ctx := context.Background()
	c := cluster.Client()
	if err := cluster.EnsureNamespace(ctx, podCertNS); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts(podCertNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := c.CoreV1().Pods(podCertNS).Create(ctx, podCertPod(podCertNS, "app", "app"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := string(pod.UID)
	want := spiffeid.RequireFromString("spiffe://cluster.local/ns/" + podCertNS + "/sa/app")
	waitPodsRunning(t, podCertNS, "app")
	first := readCredential(t, uid, want)

	ctb, err := c.CertificatesV1().ClusterTrustBundles().Get(ctx, podCertBundle, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ctb.Spec.SignerName != podCertSigner || !sameCerts(t, []byte(ctb.Spec.TrustBundle), first.rootsPEM) {
		t.Errorf("roots.pem is not the ClusterTrustBundle %s of %s:\n%s", podCertBundle, ctb.Spec.SignerName, first.rootsPEM)
	}
	cm, err := c.CoreV1().ConfigMaps(podCertNS).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !sameCerts(t, []byte(cm.Data["root-cert.pem"]), first.rootsPEM) {
		t.Errorf("roots.pem differs from the CA's istio-ca-root-cert:\n%s\n%s", first.rootsPEM, cm.Data["root-cert.pem"])
	}
	pcr := issuedPCR(t, "app", first.chainPEM)
	if pcr.Spec.PodUID != pod.UID || pcr.Status.BeginRefreshAt == nil {
		t.Fatalf("PodCertificateRequest %s: pod UID %s, beginRefreshAt %v", pcr.Name, pcr.Spec.PodUID, pcr.Status.BeginRefreshAt)
	}
	waitCALogs(t, `"serial":"`+first.serial()+`"`, `"spiffe_id":"`+want.String()+`"`)
	waitLogMatch(t, podCertNS, "app", "app", "cert serial="+first.serial()+" uri="+want.String()+" at=")

	// The refresh: beginRefreshAt is notBefore+10m (the chart's
	// refreshRatio); the kubelet acts up to 5 minutes of jitter and a
	// 1-2 minute pass later. Wait on the file, with that deadline.
	refreshAt := pcr.Status.BeginRefreshAt.Time
	if min := first.svid.Certificates[0].NotBefore.Add(10 * time.Minute); !refreshAt.Equal(min) {
		t.Fatalf("beginRefreshAt %s, want notBefore+10m = %s with refreshRatio %s", refreshAt, min, podCertRefreshRatio)
	}
	podCertRefreshes.Add(1)
	defer podCertRefreshes.Done()
	t.Logf("waiting, in parallel with the other tests, for the kubelet's refresh after %s", refreshAt.Format(time.TimeOnly))
	t.Parallel()
	deadline := time.Until(refreshAt.Add(5*time.Minute + 2*time.Minute + 3*time.Minute))
	var second credential
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, max(deadline, time.Minute), true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(filepath.Join(nd.ProjectedVolumeDir(uid, podCertVolume), "credentialbundle.pem"))
		if err != nil {
			return false, nil
		}
		s := leafSerial(b)
		return s != "" && s != first.serial(), nil
	})
	if err != nil {
		t.Fatalf("the kubelet mounted no new certificate by %s (beginRefreshAt %s)", time.Now().Format(time.TimeOnly), refreshAt.Format(time.TimeOnly))
	}
	second = readCredential(t, uid, want)
	k1, _ := x509.MarshalPKIXPublicKey(first.svid.PrivateKey.Public())
	k2, _ := x509.MarshalPKIXPublicKey(second.svid.PrivateKey.Public())
	if second.serial() == first.serial() || bytes.Equal(k1, k2) {
		t.Errorf("the refreshed credential keeps the serial %s or the key", first.serial())
	}
	refreshed := issuedPCR(t, "app", second.chainPEM)
	if refreshed.Name == pcr.Name || refreshed.CreationTimestamp.Time.Before(refreshAt) {
		t.Errorf("the new certificate's PodCertificateRequest %s was created at %s, before the first's beginRefreshAt %s", refreshed.Name, refreshed.CreationTimestamp, refreshAt)
	}
	waitLogMatch(t, podCertNS, "app", "app", "cert serial="+second.serial()+" uri="+want.String()+" at=")
}

// waitPodsRunning waits until pod name in ns has every container running
// (a pod without a readiness probe is Ready when they run).
func waitPodsRunning(t *testing.T, ns, name string) {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		var pods []corev1.Pod
		if pod != nil {
			pods = append(pods, *pod)
		}
		events, _ := cluster.Client().CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		var ev strings.Builder
		if events != nil {
			for _, e := range events.Items {
				fmt.Fprintf(&ev, "%s %s: %s\n", e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
		t.Fatalf("pod %s/%s not Ready: %v\n%s\nevents:\n%s\n%s", ns, name, err, describe(pods), ev.String(), nd.Logs())
	}
}

// caLogs is the logs of every CA pod, joined.
func caLogs(t *testing.T) string {
	t.Helper()
	pods, err := cluster.Client().CoreV1().Pods(caNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshid"})
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, p := range pods.Items {
		b, err := cluster.Client().CoreV1().Pods(caNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "meshid"}).DoRaw(context.Background())
		if err != nil {
			t.Fatalf("log of %s: %v", p.Name, err)
		}
		fmt.Fprintf(&all, "--- %s\n%s", p.Name, b)
	}
	return all.String()
}

// waitCALogs waits until one line of a CA pod's log holds every part.
func waitCALogs(t *testing.T, parts ...string) {
	t.Helper()
	var logs string
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		logs = caLogs(t)
		for _, line := range strings.Split(logs, "\n") {
			if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no CA log line with %q:\n%s", parts, tail(logs, 6000))
	}
}
