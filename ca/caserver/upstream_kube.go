package caserver

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// The Secret that holds the intermediate the upstream minted when the
// replicas share it (--upstream with --kube-ca-secret): beside the CA
// Secrets, in the CA's namespace, in Istio's plugged-in layout
// (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem). Only the
// elected leader writes it; every replica loads it.
const (
	UpstreamSecret = "meshid-ca-upstream"
	// MaxUpstreamSecretSize bounds the Secret's data: a replica refuses a
	// larger one without parsing it (an intermediate, its chain, the
	// upstream's roots and a key take a few KiB).
	MaxUpstreamSecretSize = 256 << 10
)

// upstreamWriteTimeout bounds one write of UpstreamSecret.
const upstreamWriteTimeout = 30 * time.Second

// upstreamKube shares the upstream's intermediate between the replicas
// through UpstreamSecret: the elected leader mints (when the Secret holds
// no valid intermediate, then at each renewal point, with the Renewer),
// writes the Secret and offers the intermediate to its rotation; every
// replica sees the Secret change, checks it as an upstream answer, and
// offers the same intermediate to its own rotation, whose activation
// follows the leader's record (kubeRotationState). A follower never calls
// the upstream.
type upstreamKube struct {
	client    kubeclient.Interface
	namespace string
	leader    func() bool
	renewer   *upstream.Renewer
	clock     clock.Clock
	log       *slog.Logger

	first  chan struct{} // closed at the first valid intermediate
	synced chan struct{} // closed once the informer has handed over the Secret, if any

	// mu serialises the leader's write with the informer's handler, so
	// that the leader's own write, seen back, is known.
	mu   sync.Mutex
	last *keystore.Bundle  // the newest valid intermediate seen or written
	rot  *rotation.Manager // nil until attach
	once sync.Once         // closes first

	tgt upstreamSecretWrite // the leader's Renewer Target
}

// newUpstreamKube builds the renewer (run only on the leader) and the
// Controller that elects it and publishes the roots of the authority,
// once Run has built it.
func (s *Server) newUpstreamKube() error {
	cfg := s.cfg
	ua, err := newUpstreamAuthority(cfg.Upstream)
	if err != nil {
		return err
	}
	s.upstream, err = upstream.NewRenewer(upstream.RenewerConfig{
		Upstream:    ua,
		Name:        cfg.Upstream.URL.String(),
		TrustDomain: cfg.TrustDomain,
		KeyType:     cfg.RootKeyType,
		Lifetime:    cfg.Upstream.Lifetime,
		RenewAt:     cfg.Upstream.RenewAt,
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  cfg.Registerer,
	})
	if err != nil {
		return err
	}
	u := &upstreamKube{
		client:    s.kc.controllers,
		namespace: cfg.Kube.Namespace,
		renewer:   s.upstream,
		clock:     cfg.Clock,
		log:       cfg.Logger.With(logs.KeyComponent, "ca-upstream", logs.KeySecret, UpstreamSecret),
		first:     make(chan struct{}),
		synced:    make(chan struct{}),
	}
	u.tgt = upstreamSecretWrite{u: u}
	if s.kube, err = newKubeStack(cfg, s.kc.controllers, authorityRoots{s}, u.lead); err != nil {
		return err
	}
	u.leader = s.kube.ctrl.IsLeader
	s.upKube = u
	return nil
}

// authorityRoots is the authority's bundle for the root publisher, nil
// until Run has built the authority.
type authorityRoots struct{ s *Server }

func (a authorityRoots) Bundle() *keystore.Bundle {
	if au := a.s.Authority(); au != nil {
		return au.Bundle()
	}
	return nil
}

// run watches UpstreamSecret until ctx ends.
func (u *upstreamKube) run(ctx context.Context) error {
	inf := kubeclient.NamedSecretInformer(u.client, u.namespace, UpstreamSecret)
	handle := func(obj any) {
		// The name check too: a fake client ignores the field selector.
		if sec, ok := obj.(*corev1.Secret); ok && sec.Name == UpstreamSecret {
			u.seen(sec)
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	})
	if err != nil {
		return fmt.Errorf("caserver: Secret %s: %w", UpstreamSecret, err)
	}
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			close(u.synced)
		}
	}()
	inf.RunWithContext(ctx)
	return nil
}

// seen takes a version of the Secret: refused with a log (and the
// rotation marked stuck) unless it holds an intermediate that passes the
// checks of an upstream answer; else, if new, offered to the rotation.
func (u *upstreamKube) seen(sec *corev1.Secret) {
	log := u.log.With(logs.KeyResourceVersion, sec.ResourceVersion)
	b, err := loadUpstreamSecret(sec.Data, u.clock.Now())
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil {
		log.Error("the upstream intermediate in the Secret is refused; the current CA keeps signing", logs.KeyError, err)
		if u.rot != nil {
			u.rot.Refuse(err) // meshid_ca_rotation_stuck, until a valid version
		}
		return
	}
	if u.last != nil && u.last.Cert.Equal(b.Cert) {
		if u.rot != nil {
			_ = u.rot.SetBundle(u.last) // nothing new; clears a refusal's stuck state
		}
		return // the leader's own write, a resync, or a refused edit undone
	}
	log.Info("upstream intermediate loaded from the Secret", logs.KeySubject, b.Cert.Subject.String(),
		logs.KeySerial, b.Cert.SerialNumber.Text(16), logs.KeyNotAfter, b.Cert.NotAfter)
	u.adoptLocked(b)
}

// adoptLocked makes b the newest intermediate: the first one starts the
// CA, a later one goes to the rotation.
func (u *upstreamKube) adoptLocked(b *keystore.Bundle) {
	u.last = b
	u.once.Do(func() { close(u.first) })
	// The renewer's view, for `meshid certs status` and for the day this
	// replica leads (renewal counted from b's NotBefore; the leader's own
	// mint sets the mint time right after).
	u.renewer.Start(b, time.Time{}, u.tgt)
	if u.rot != nil {
		if err := u.rot.SetBundle(b); err != nil {
			u.log.Error("the rotation refused the upstream intermediate of the Secret", logs.KeyError, err)
		}
	}
}

// loadUpstreamSecret returns the intermediate data holds, checked as an
// upstream answer: at most MaxUpstreamSecretSize bytes; a CA certificate
// for the key beside it, that may sign certificates, valid now, whose
// chain verifies to the roots beside it within its path length.
func loadUpstreamSecret(data map[string][]byte, now time.Time) (*keystore.Bundle, error) {
	size := 0
	for k, v := range data {
		size += len(k) + len(v)
	}
	if size > MaxUpstreamSecretSize {
		return nil, fmt.Errorf("caserver: Secret %s: %d bytes, more than the %d allowed", UpstreamSecret, size, MaxUpstreamSecretSize)
	}
	b, err := keystore.LoadFiles(data, now)
	if err != nil {
		return nil, fmt.Errorf("caserver: Secret %s: %w", UpstreamSecret, err)
	}
	m := &upstream.Minted{Chain: append([]*x509.Certificate{b.Cert}, b.Intermediates...), Roots: b.Roots}
	if err := upstream.Check(m, b.Key.Public(), now, 0); err != nil {
		return nil, fmt.Errorf("caserver: Secret %s: %w", UpstreamSecret, err)
	}
	return b, nil
}

// wait returns the first valid intermediate of the Secret, which the
// leader mints if there is none.
func (u *upstreamKube) wait(ctx context.Context) (*keystore.Bundle, error) {
	u.log.Info("waiting for the upstream intermediate in the Secret", logs.KeyNamespace, u.namespace)
	select {
	case <-u.first:
	case <-ctx.Done():
		return nil, fmt.Errorf("caserver: waiting for Secret %s: %w", UpstreamSecret, ctx.Err())
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last, nil
}

// attach hands the rotation every later intermediate, and the one seen
// since wait returned, if any.
func (u *upstreamKube) attach(r *rotation.Manager) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.rot = r
	if u.last != nil {
		if err := r.SetBundle(u.last); err != nil {
			u.log.Error("the rotation refused the upstream intermediate of the Secret", logs.KeyError, err)
		}
	}
}

// lead is the leader's task: once the informer has handed over the
// Secret, it mints if the Secret holds no valid intermediate (retrying
// with the renewer's backoff), then renews at each renewal point until
// this replica stops leading. A new leader finds the Secret's
// intermediate and mints only at its renewal point.
func (u *upstreamKube) lead(ctx context.Context) {
	select {
	case <-u.synced:
	case <-ctx.Done():
		return
	}
	u.mu.Lock()
	b := u.last
	u.mu.Unlock()
	for attempt := 1; b == nil; attempt++ {
		var err error
		if b, err = u.mintFirst(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		d := min(upstream.DefaultRetryMin<<min(attempt-1, 16), upstream.DefaultRetryMax)
		d = time.Duration(float64(d) * (0.8 + 0.4*mrand.Float64()))
		u.log.Error("no valid intermediate in the Secret and the upstream CA did not mint one; the CA does not serve until it does",
			logs.KeyError, err, logs.KeyAttempts, attempt, logs.KeyRetryIn, d.Round(time.Second))
		t := u.clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
	st, _ := u.renewer.Status()
	u.log.Info("leading: the upstream intermediate is renewed by this replica", logs.KeySerial, st.Serial,
		logs.KeyRenewAt, st.RenewAt)
	_ = u.renewer.Run(ctx)
}

// mintFirst mints the first intermediate and writes it.
func (u *upstreamKube) mintFirst(ctx context.Context) (*keystore.Bundle, error) {
	b, err := u.renewer.Mint(ctx)
	if err != nil {
		return nil, err
	}
	if err := u.tgt.SetBundle(b); err != nil {
		return nil, err
	}
	now := u.clock.Now()
	u.renewer.Start(b, now, u.tgt)
	u.log.Info("intermediate minted by the upstream CA and written to the Secret", logs.KeySubject, b.Cert.Subject.String(),
		logs.KeySerial, b.Cert.SerialNumber.Text(16), logs.KeyNotAfter, b.Cert.NotAfter, logs.KeyRenewAt, u.renewer.RenewAt(b, now))
	return b, nil
}

// upstreamSecretWrite is the leader's Renewer Target: it writes an
// accepted intermediate to the Secret, then offers it to the rotation.
type upstreamSecretWrite struct{ u *upstreamKube }

// SetBundle writes b to the Secret (the leader only) and adopts it.
func (w upstreamSecretWrite) SetBundle(b *keystore.Bundle) error {
	u := w.u
	if !u.leader() {
		return errors.New("caserver: no longer the leader: the intermediate is not written")
	}
	ctx, cancel := context.WithTimeout(context.Background(), upstreamWriteTimeout)
	defer cancel()
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.write(ctx, b); err != nil {
		return err
	}
	u.adoptLocked(b)
	return nil
}

// write creates or replaces the Secret's data with b.
func (u *upstreamKube) write(ctx context.Context, b *keystore.Bundle) error {
	key, err := certs.EncodePrivateKey(b.Key)
	if err != nil {
		return fmt.Errorf("caserver: %w", err)
	}
	data := map[string][]byte{
		keystore.CACertFile:    certs.EncodeCertificates(b.Cert),
		keystore.CertChainFile: certs.EncodeCertificates(b.Intermediates...),
		keystore.RootCertFile:  certs.EncodeCertificates(b.Roots...),
		keystore.CAKeyFile:     key,
	}
	secrets := u.client.CoreV1().Secrets(u.namespace)
	sec, err := secrets.Get(ctx, UpstreamSecret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: UpstreamSecret, Namespace: u.namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "meshid"}},
			Data: data,
		}, metav1.CreateOptions{})
	case err == nil:
		sec = sec.DeepCopy()
		sec.Data = data
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("caserver: Secret %s: %w", UpstreamSecret, err)
	}
	return nil
}
