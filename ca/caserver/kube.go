package caserver

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube"
)

// kubeClient returns a client from kubeconfig, the in-cluster config when
// running in a pod, or nil when neither is available.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
	} else {
		cfg, err = rest.InClusterConfig()
		if err == rest.ErrNotInCluster {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
	}
	cfg.UserAgent = "meshid"
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return kc, nil
}

// kubeStack runs the ca/kube Controller for the CA.
type kubeStack struct {
	ctrl *kube.Controller
}

func newKubeStack(cfg Config, kc kubernetes.Interface) (*kubeStack, error) {
	ctrl, err := kube.New(kube.Config{
		Client:      kc,
		Namespace:   cfg.Namespace,
		Identity:    cfg.PodName,
		TrustDomain: cfg.TrustDomain.Name(),
		RootKeyType: cfg.RootKeyType,
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	return &kubeStack{ctrl: ctrl}, nil
}

// waitForBundle waits for the Controller's first bundle, which the leader
// creates if no CA Secret exists yet.
func (k *kubeStack) waitForBundle(ctx context.Context, log *slog.Logger, namespace string) (*keystore.Bundle, error) {
	log.Info("waiting for the CA Secret", "namespace", namespace)
	b, err := k.ctrl.WaitForBundle(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube keystore: %w", err)
	}
	return b, nil
}

// attach feeds every later bundle (Secret rotation) to the authority.
func (k *kubeStack) attach(a *ca.Authority) { k.ctrl.Bind(a) }

func (k *kubeStack) ready() error { return k.ctrl.Ready() }

func (k *kubeStack) run(ctx context.Context) error { return k.ctrl.Run(ctx) }
