package secretstore

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/internal/logs"
)

// ManagedByLabel marks the objects meshid writes.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "meshid"
)

// Bootstrap is the leader's task: it creates the self-signed root Secret
// when neither Secret exists, now and every time Run later sees both gone,
// until ctx ends. It never overwrites an existing Secret, valid or not.
// Failed attempts are retried every Config.RetryInterval. It returns nil
// when ctx ends.
func (s *Store) Bootstrap(ctx context.Context) error {
	for {
		if err := s.EnsureRoot(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Error("cannot ensure the CA Secret; retrying", logs.KeyError, err, logs.KeyRetryIn, s.cfg.RetryInterval)
			t := s.clock.NewTimer(s.cfg.RetryInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.missing:
		}
	}
}

// EnsureRoot creates the self-signed root Secret unless it or the plugged
// Secret exists. Losing the create race to another replica is not an error:
// Run loads whichever Secret won.
func (s *Store) EnsureRoot(ctx context.Context) error {
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	for _, name := range []string{s.cfg.PluggedSecretName, s.cfg.SecretName} {
		_, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("secretstore: get Secret %s/%s: %w", s.cfg.Namespace, name, err)
		}
	}
	data, err := s.newRootData()
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      s.cfg.SecretName,
			Namespace: s.cfg.Namespace,
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
		},
		Type: SecretType,
		Data: data,
	}
	_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		s.log.Info("another replica created the CA Secret first; using it", logs.KeySecret, s.cfg.SecretName)
		return nil
	case err != nil:
		return fmt.Errorf("secretstore: create Secret %s/%s: %w", s.cfg.Namespace, s.cfg.SecretName, err)
	}
	s.creates.Inc()
	s.log.Info("created self-signed root CA Secret", logs.KeySecret, s.cfg.SecretName)
	return nil
}

// newRootData creates a self-signed root and returns it as Secret data in
// Istio's plugged-in layout, checked to load back.
func (s *Store) newRootData() (map[string][]byte, error) {
	_, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{
		TrustDomain: s.cfg.TrustDomain,
		KeyType:     s.cfg.KeyType,
		TTL:         s.cfg.RootTTL,
		Clock:       s.clock,
	})
	if err != nil {
		return nil, fmt.Errorf("secretstore: create self-signed root: %w", err)
	}
	data := make(map[string][]byte, len(files))
	for k, v := range files {
		data[k] = v
	}
	// Every replica must be able to load what the leader writes.
	if _, err := keystore.LoadFiles(data, s.clock.Now()); err != nil {
		return nil, fmt.Errorf("secretstore: new self-signed root does not load back: %w", err)
	}
	return data, nil
}
