package caserver

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	"github.com/meshid/meshid/ca/kubeclient"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/internal/logs"
)

// The Secret that holds the rotation's state when the CA is kept in a
// Secret: beside the CA Secrets, in the CA's namespace, with the same
// protection (whoever may write it may replace cacerts as well).
const (
	RotationStateSecret = "meshid-ca-rotation"
	rotationStateKey    = "rotation.json"
)

// kubeRotationState keeps the rotation's Record in RotationStateSecret:
// every replica restores it at start and follows it (an informer on that
// one Secret), so that all replicas keep the leader's clock; only the
// leader writes it.
type kubeRotationState struct {
	client    kubeclient.Interface
	namespace string
	leader    func() bool
	log       *slog.Logger
}

// Save writes data on the leader; the other replicas follow the leader's
// record (rotation.ErrNotWriter).
func (k *kubeRotationState) Save(ctx context.Context, data []byte) error {
	if !k.leader() {
		return rotation.ErrNotWriter
	}
	secrets := k.client.CoreV1().Secrets(k.namespace)
	sec, err := secrets.Get(ctx, RotationStateSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: RotationStateSecret, Namespace: k.namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "meshid"}},
			Data: map[string][]byte{rotationStateKey: data},
		}
		_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
		return wrapState(err)
	}
	if err != nil {
		return wrapState(err)
	}
	if bytes.Equal(sec.Data[rotationStateKey], data) {
		return nil
	}
	sec = sec.DeepCopy()
	sec.Data = map[string][]byte{rotationStateKey: data}
	_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	return wrapState(err)
}

func wrapState(err error) error {
	if err != nil {
		return fmt.Errorf("caserver: rotation state Secret %s: %w", RotationStateSecret, err)
	}
	return nil
}

// restore hands the saved record, if any, to r (before it serves). A
// Secret that cannot be read is logged, not fatal: the CA serves on the
// CA Secret alone, as before a rotation state existed.
func (k *kubeRotationState) restore(ctx context.Context, r *rotation.Manager) {
	sec, err := k.client.CoreV1().Secrets(k.namespace).Get(ctx, RotationStateSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		k.log.Error("the saved rotation state could not be read: roots only it held are not restored", logs.KeyError, wrapState(err))
		return
	}
	_ = r.Restore(sec.Data[rotationStateKey]) // a refused record is logged and makes the rotation stuck
}

// follow hands every version of the record to r.Follow until ctx ends.
func (k *kubeRotationState) follow(ctx context.Context, r *rotation.Manager) error {
	inf := kubeclient.NamedSecretInformer(k.client, k.namespace, RotationStateSecret)
	handle := func(obj any) {
		// The name check too: a fake client ignores the field selector.
		if sec, ok := obj.(*corev1.Secret); ok && sec.Name == RotationStateSecret {
			_ = r.Follow(sec.Data[rotationStateKey]) // a refused record is logged
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return wrapState(err)
	}
	inf.RunWithContext(ctx)
	return nil
}
