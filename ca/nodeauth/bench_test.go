package nodeauth_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/testkit"
)

// realisticPod is a pod about the size of a real one in a mesh (labels,
// annotations, two containers with env and resources, managed fields,
// conditions): what an informer without a transform keeps.
func realisticPod(i, nodes int) *corev1.Pod {
	ns := "ns-" + strconv.Itoa(i%50)
	name := "app-" + strconv.Itoa(i) + "-7d9f8c6b5-x2x4z"
	env := make([]corev1.EnvVar, 12)
	for j := range env {
		env[j] = corev1.EnvVar{Name: "ENV_" + strconv.Itoa(j), Value: strings.Repeat("v", 40)}
	}
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)),
			Labels:          map[string]string{"app": "app-" + strconv.Itoa(i%200), "pod-template-hash": "7d9f8c6b5", "version": "v1", "security.istio.io/tlsMode": "istio"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("{}", 600), "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "app-7d9f8c6b5", UID: "rs-uid"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update", APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(strings.Repeat(`{"f:x":{}}`, 150))}}},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: "app-" + strconv.Itoa(i%200), NodeName: "node-" + strconv.Itoa(i%nodes),
			Containers: []corev1.Container{
				{Name: "app", Image: "registry.example/app:1.2.3", Env: env, Resources: res, Ports: []corev1.ContainerPort{{ContainerPort: 8080}}},
				{Name: "istio-proxy", Image: "docker.io/istio/proxyv2:1.28.0", Env: env, Resources: res},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}}},
	}
}

const benchPods, benchNodes = 10000, 100

func benchCluster() []k8sruntime.Object {
	objs := make([]k8sruntime.Object, 0, benchPods+1)
	for i := range benchPods {
		objs = append(objs, realisticPod(i, benchNodes))
	}
	return append(objs, ztunnelPod)
}

// BenchmarkInformerMemory reports the heap the pod informer holds per pod
// (store and index), with the transform (what nodeauth runs) and without
// it (the whole object), for 10,000 realistic pods.
func BenchmarkInformerMemory(b *testing.B) {
	for _, slim := range []bool{true, false} {
		name := "transform"
		if !slim {
			name = "whole_pods"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				client := fake.NewClientset(benchCluster()...)
				before := heap()
				var synced func() bool
				var stop func()
				if slim {
					a, err := nodeauth.New(nodeauth.Config{TrustedAccounts: []identity.ServiceAccount{ztunnelSA}, Client: client, TrustDomain: td})
					if err != nil {
						b.Fatal(err)
					}
					stop = testkit.Start(b, "node authorizer", a.Run)
					synced = a.HasSynced
				} else {
					f := kubeclient.NewInformerFactory(client, 0)
					inf := f.Pods().Informer()
					if err := inf.AddIndexers(cache.Indexers{"node": func(o any) ([]string, error) { return []string{o.(*corev1.Pod).Spec.NodeName}, nil }}); err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					f.Start(ctx.Done())
					stop = func() { cancel(); f.Shutdown() }
					synced = inf.HasSynced
				}
				if !cache.WaitForCacheSync(make(chan struct{}), synced) {
					b.Fatal("not synced")
				}
				after := heap()
				b.ReportMetric(float64(int64(after)-int64(before))/benchPods, "heap-B/pod")
				stop()
			}
		})
	}
}

// BenchmarkAuthorize is one allowed decision on a synced informer of
// 10,000 pods on 100 nodes: the node agent on node-0 asks for pod 0's
// identity.
func BenchmarkAuthorize(b *testing.B) {
	agent := pod("istio-system", "ztunnel-0", "ztunnel", "node-0", corev1.PodRunning)
	a, err := nodeauth.New(nodeauth.Config{TrustedAccounts: []identity.ServiceAccount{ztunnelSA}, Client: fake.NewClientset(append(benchCluster(), agent)...), TrustDomain: td})
	if err != nil {
		b.Fatal(err)
	}
	testkit.Run(b, "node authorizer", a.Run)
	if !cache.WaitForCacheSync(make(chan struct{}), a.HasSynced) {
		b.Fatal("not synced")
	}
	caller := &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: agent.Name, PodUID: string(agent.UID), NodeName: "node-0", Method: authn.MethodTokenReview}
	target := id("ns-0", "app-0")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := a.Authorize(ctx, caller, target); err != nil {
			b.Fatal(err)
		}
	}
}
