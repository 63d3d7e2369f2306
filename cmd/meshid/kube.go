package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/kubernetes"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube"
	kubeclient "github.com/meshid/meshid/ca/kube/client"
	"github.com/meshid/meshid/certs"
)

// kubeFlags configure the CA's Kubernetes-native features.
type kubeFlags struct {
	caSecret  bool
	namespace string
	podName   string
}

func (f *kubeFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.caSecret, "kube-ca-secret", false, "keep the CA in the Secret meshid-ca (or Istio's cacerts) of --namespace, elect a leader with a Lease, and publish the istio-ca-root-cert ConfigMap to every namespace (needs a Kubernetes client)")
	fs.StringVar(&f.namespace, "namespace", "istio-system", "the CA's own namespace (env POD_NAMESPACE)")
	fs.StringVar(&f.podName, "pod-name", "", "this replica's identity for leader election (env POD_NAME; default the hostname)")
}

// kubeClient returns a client from --kubeconfig, the in-cluster config when
// running in a pod, or nil when neither is available. It is ca/kube/client's
// TokenReview client, whose rate limits are sized for a CA (client-go's
// default QPS 5 capped the CA at 5 fresh-token certificates per second).
// TODO(issue 18): wire --kube-qps/--kube-burst and hand Controllers to the
// ca/kube Controller once the assembly lives in ca/caserver.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cs, err := kubeclient.New(kubeclient.Config{Kubeconfig: kubeconfig})
	if errors.Is(err, kubeclient.ErrNotInCluster) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return cs.Auth, nil
}

// kubeStack runs the ca/kube Controller for the CA.
type kubeStack struct {
	ctrl *kube.Controller
	done chan error // the Controller's Run result
}

// startKubeKeystore starts the Controller and waits for its first bundle,
// which the leader creates if no CA Secret exists yet.
func startKubeKeystore(ctx context.Context, f *serverFlags, kc kubernetes.Interface, td spiffeid.TrustDomain, keyType certs.KeyType, reg prometheus.Registerer, logger *slog.Logger) (*kubeStack, *keystore.Bundle, error) {
	id := f.kube.podName
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, nil, fmt.Errorf("--pod-name: %w", err)
		}
		id = h
	}
	ctrl, err := kube.New(kube.Config{
		Client:      kc,
		Namespace:   f.kube.namespace,
		Identity:    id,
		TrustDomain: td.Name(),
		RootKeyType: keyType,
		Logger:      logger,
		Registerer:  reg,
	})
	if err != nil {
		return nil, nil, err
	}
	ks := &kubeStack{ctrl: ctrl, done: make(chan error, 1)}
	go func() { ks.done <- ctrl.Run(ctx) }()
	logger.Info("waiting for the CA Secret", "namespace", f.kube.namespace)
	b, err := ctrl.WaitForBundle(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("kube keystore: %w", err)
	}
	return ks, b, nil
}

// attach feeds every later bundle (Secret rotation) to the authority.
func (k *kubeStack) attach(a *ca.Authority) { k.ctrl.Bind(a) }

func (k *kubeStack) ready() error { return k.ctrl.Ready() }

func (k *kubeStack) run(ctx context.Context) error {
	select {
	case err := <-k.done:
		return err
	case <-ctx.Done():
		return <-k.done
	}
}
