package e2e_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/kubeclient"
)

// protobufClient is a kubeclient as ca/kubeclient configures the CA's:
// protobuf on the wire, JSON accepted.
func protobufClient(t *testing.T) *kubeclient.Clientset {
	t.Helper()
	cfg := cluster.AdminConfig()
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestKubeclientTypedClients: each of the narrow client's resources does
// its verbs against the real API server, in protobuf, including a 404 and
// a conflict as the API's own errors, a patch, a watch and a TokenReview of
// a real token.
func TestKubeclientTypedClients(t *testing.T) {
	ctx := context.Background()
	c := protobufClient(t)
	ns := "kubeclient-typed"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	secrets := c.CoreV1().Secrets(ns)
	if _, err := secrets.Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get of a missing Secret: %v, want NotFound", err)
	}
	s, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{"k": "v"}}, Data: map[string][]byte{"key": {0, 1, 2}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stale := s.DeepCopy()
	s.Data["key"] = []byte("new")
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update of a stale Secret: %v, want Conflict", err)
	}
	list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: "k=v"})
	if err != nil || len(list.Items) != 1 || string(list.Items[0].Data["key"]) != "new" {
		t.Fatalf("list: %v %+v", err, list)
	}

	cms := c.CoreV1().ConfigMaps(ns)
	w, err := cms.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"a": "1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if cm, ok := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || !ok || cm.Name != "cm" {
			t.Fatalf("watch event %v %T", ev.Type, ev.Object)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no watch event for the created ConfigMap")
	}
	patched, err := cms.Patch(ctx, "cm", types.MergePatchType, []byte(`{"data":{"b":"2"}}`), metav1.PatchOptions{})
	if err != nil || patched.Data["a"] != "1" || patched.Data["b"] != "2" {
		t.Fatalf("patch: %v %v", err, patched)
	}
	if err := cms.Delete(ctx, "cm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	leases := c.CoordinationV1().Leases(ns)
	l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: new("a"), LeaseDurationSeconds: new(int32(15))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = new("b")
	if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil || *l.Spec.HolderIdentity != "b" {
		t.Fatalf("lease update: %v", err)
	}

	if err := cluster.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	if sa, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "app", metav1.GetOptions{}); err != nil || sa.UID == "" {
		t.Fatalf("service account: %v", err)
	}
	pod, err := cluster.CreatePod(ctx, ns, "app-0", "app")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "app-0", metav1.GetOptions{}); err != nil || p.UID != pod.UID {
		t.Fatalf("pod: %v", err)
	}
	tok := workloadFixture{ns: ns, sa: "app", pod: pod}.token(t, "istio-ca")
	tr, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Status.Authenticated || tr.Status.User.Username != "system:serviceaccount:"+ns+":app" {
		t.Fatalf("TokenReview of a genuine token: %+v", tr.Status)
	}
	tr, err = c.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok + "x", Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
	if err != nil || tr.Status.Authenticated {
		t.Fatalf("TokenReview of a forged token: %v %+v", err, tr.Status)
	}
}

// TestKubeclientInformers: the informer factory's namespaced, label
// selected Secret informer syncs, sees what matches and only that, stores
// the transformed object, and its lister reads the cache; the metadata
// informer holds pods' metadata.
func TestKubeclientInformers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := protobufClient(t)
	ns := "kubeclient-informers"
	if err := cluster.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	create := func(ns, name string, labels map[string]string) {
		t.Helper()
		if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(ns, "before", map[string]string{"pick": "yes"})
	create(ns, "unlabelled", nil)
	create("default", "elsewhere", map[string]string{"pick": "yes"})

	f := kubeclient.NewInformerFactory(c, 0, kubeclient.WithNamespace(ns),
		kubeclient.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "pick=yes" }),
		kubeclient.WithTransform(func(obj any) (any, error) {
			if s, ok := obj.(*corev1.Secret); ok {
				s = s.DeepCopy()
				s.Annotations = map[string]string{"transformed": "true"}
				return s, nil
			}
			return obj, nil
		}))
	inf := f.Secrets()
	added := make(chan string, 10)
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { added <- obj.(*corev1.Secret).Name }}); err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	defer func() { cancel(); f.Shutdown() }() // Shutdown waits for the informers, which stop with ctx
	if synced := f.WaitForCacheSync(ctx.Done()); len(synced) != 1 || !synced[reflect.TypeOf(&corev1.Secret{})] {
		t.Fatalf("WaitForCacheSync: %v", synced)
	}
	create(ns, "after", map[string]string{"pick": "yes"})
	deadline := time.After(30 * time.Second)
	seen := map[string]bool{}
	for !seen["after"] {
		select {
		case n := <-added:
			seen[n] = true
		case <-deadline:
			t.Fatalf("informer saw %v, not the Secret created after sync", seen)
		}
	}
	got, err := inf.Lister().Secrets(ns).List(labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range got {
		names[s.Name] = true
		if s.Annotations["transformed"] != "true" {
			t.Errorf("secret %s stored untransformed", s.Name)
		}
	}
	if len(names) != 2 || !names["before"] || !names["after"] {
		t.Fatalf("lister has %v, want before and after only (not unlabelled, not another namespace's)", names)
	}

	md, err := metadata.NewForConfig(cluster.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.CreatePod(ctx, ns, "app-0", "app")
	if err != nil {
		t.Fatal(err)
	}
	mi := kubeclient.NewMetadataInformer(md, schema.GroupVersionResource{Version: "v1", Resource: "pods"}, 0, nil)
	go mi.Informer().Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), mi.Informer().HasSynced) {
		t.Fatal("metadata informer did not sync")
	}
	obj, err := mi.Lister().ByNamespace(ns).Get("app-0")
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := obj.(*metav1.PartialObjectMetadata); !ok || m.UID != pod.UID {
		t.Fatalf("metadata informer holds %T %+v", obj, obj)
	}
}
