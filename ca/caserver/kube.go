package caserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/internal/logs"
)

// kubeClients are the CA's two Kubernetes clients: auth sends
// TokenReviews, controllers serves election, the publisher and informers,
// each with its own rate limit so that neither starves the other.
type kubeClients struct {
	auth, controllers kubeclient.Interface
	// metadata serves the bound-token verifier's informers, at the
	// controllers' rate limit; nil with Config.Kube.Client.
	metadata metadata.Interface
	// podcerts answers PodCertificateRequests, at the TokenReview
	// client's rate (one status write per pod certificate, a restart
	// storm's worth); nil unless PodCertificateSigner.
	podcerts kubeclient.Interface
}

// newKubeClients returns cfg.Kube.Client for both, clients from Kubeconfig
// or the in-cluster config, or nil outside a cluster with no kubeconfig.
func newKubeClients(cfg Config) (*kubeClients, error) {
	if cfg.Kube.Client != nil {
		return &kubeClients{auth: cfg.Kube.Client, controllers: cfg.Kube.Client}, nil
	}
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: cfg.Kube.Kubeconfig, QPS: cfg.Kube.QPS, Burst: cfg.Kube.Burst})
	if errors.Is(err, kubeclient.ErrNotInCluster) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("caserver: kubernetes client: %w", err)
	}
	md, err := metadata.NewForConfig(rest.CopyConfig(cs.ControllerConfig))
	if err != nil {
		return nil, fmt.Errorf("caserver: kubernetes metadata client: %w", err)
	}
	kc := &kubeClients{auth: cs.Auth, controllers: cs.Controllers, metadata: md}
	if cfg.Kube.PodCertificateSigner != "" {
		pc := rest.CopyConfig(cs.AuthConfig)
		pc.UserAgent = kubeclient.DefaultUserAgent + "/podcertificates"
		if kc.podcerts, err = kubeclient.New(pc); err != nil {
			return nil, fmt.Errorf("caserver: pod certificate client: %w", err)
		}
	}
	return kc, nil
}

// kubeStack runs the ca/kube Controller for the CA.
type kubeStack struct {
	ctrl  *kube.Controller
	state *kubeRotationState // the rotation's state Secret, with KubeCASecret
}

// newKubeStack builds the Controller: with roots nil it keeps the CA in a
// Secret (KubeCASecret); otherwise it publishes roots' bundle. lead, if
// not nil, runs on the elected replica (the upstream's minter).
func newKubeStack(cfg Config, kc kubeclient.Interface, roots kube.RootSource, lead func(context.Context)) (*kubeStack, error) {
	kcfg := kube.Config{
		Client:            kc,
		Namespace:         cfg.Kube.Namespace,
		Candidate:         election.Candidate{Identity: cfg.Kube.PodName},
		TrustDomain:       cfg.TrustDomain.Name(),
		RootKeyType:       cfg.RootKeyType,
		DisablePublisher:  cfg.Kube.DisableRootConfigMap,
		PublishNamespaces: cfg.Kube.RootConfigMapNamespaces,
		Clock:             cfg.Clock,
		Logger:            cfg.Logger,
		Registerer:        cfg.Registerer,
		Roots:             roots,
		Lead:              lead,
	}
	ctrl, err := kube.New(kcfg)
	if err != nil {
		return nil, err
	}
	return &kubeStack{ctrl: ctrl}, nil
}

// waitForBundle waits for the Controller's first bundle, which the leader
// creates if no CA Secret exists yet.
func (k *kubeStack) waitForBundle(ctx context.Context, log *slog.Logger, namespace string) (*keystore.Bundle, error) {
	log.Info("waiting for the CA Secret", logs.KeyNamespace, namespace)
	b, err := k.ctrl.WaitForBundle(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube keystore: %w", err)
	}
	return b, nil
}

// rotationState returns the rotation's Store in the cluster, written by
// the elected leader, and keeps it for followRotation.
func (k *kubeStack) rotationState(cfg Config, kc kubeclient.Interface) *kubeRotationState {
	k.state = &kubeRotationState{client: kc, namespace: cfg.Kube.Namespace, leader: k.ctrl.IsLeader, log: cfg.Logger}
	return k.state
}

// followRotation keeps r on the leader's rotation clock until ctx ends.
func (k *kubeStack) followRotation(ctx context.Context, r *rotation.Manager) error {
	return k.state.follow(ctx, r)
}

// attach feeds every later bundle (a changed Secret) to the rotation.
func (k *kubeStack) attach(r kube.BundleSetter) { k.ctrl.Bind(r) }

func (k *kubeStack) ready() error { return k.ctrl.Ready() }

func (k *kubeStack) run(ctx context.Context) error { return k.ctrl.Run(ctx) }
