package jwtsecret_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/internal/kubetest"
	"github.com/meshid/meshid/ca/kube/jwtsecret"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

const (
	ns   = "istio-system"
	life = time.Hour
	ttl  = 5 * time.Minute
)

var (
	td = spiffeid.RequireTrustDomainFromString("cluster.local")
	id = spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart")
)

// replica is one CA replica's Store, running until the test ends.
type replica struct {
	store *jwtsecret.Store
	reg   *prometheus.Registry
}

func start(t *testing.T, client *fake.Clientset, clk clock.Clock, identity string) *replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := jwtsecret.New(jwtsecret.Config{
		Client: client, Namespace: ns, Lifetime: life, TTL: ttl,
		Candidate: election.Candidate{Identity: identity, LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond},
		Clock:     clk, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return &replica{store: s, reg: reg}
}

func keyIDs(r *replica) []string {
	set, err := r.store.Keys()
	if err != nil {
		return nil
	}
	return setIDs(set)
}

// setIDs lists the key IDs of set, in order.
func setIDs(set *jwtkeys.Set) []string {
	var out []string
	for _, k := range set.Keys {
		out = append(out, k.ID)
	}
	return out
}

func issuer(t *testing.T, r *replica, clk clock.Clock) *jwtissuer.Issuer {
	t.Helper()
	i, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td, Keys: r.store, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func secretWrites(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "secrets" && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			n++
		}
	}
	return n
}

func TestReplicasSignWithTheSameKeys(t *testing.T) {
	client := fake.NewClientset()
	clk := clock.NewFake(time.Now()) // go-spiffe validates on time.Now
	a, b := start(t, client, clk, "ca-0"), start(t, client, clk, "ca-1")
	kubetest.Eventually(t, "both replicas load the leader's keys", func() bool {
		ka, kb := keyIDs(a), keyIDs(b)
		return len(ka) == 2 && slices.Equal(ka, kb)
	})
	if a.store.IsLeader() == b.store.IsLeader() {
		t.Fatalf("leaders: ca-0 %v, ca-1 %v", a.store.IsLeader(), b.store.IsLeader())
	}
	tok, err := issuer(t, a, clk).Issue(id, []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := issuer(t, b, clk).JWKS()
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := jwtbundle.Parse(td, raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jwtsvid.ParseAndValidate(tok.Token, bundle, []string{"orders"}); err != nil {
		t.Errorf("ca-0's token against ca-1's bundle: %v", err)
	}
	// One lifetime on, the leader adds the next key; both replicas see
	// it, and keep the retired one for its last tokens.
	first := keyIDs(a)
	clk.Add(life)
	kubetest.Eventually(t, "the rotated Set reaches both replicas", func() bool {
		ka, kb := keyIDs(a), keyIDs(b)
		return len(ka) == 3 && slices.Equal(ka, kb) && slices.Equal(ka[:2], first)
	})
	clk.Add(ttl)
	kubetest.Eventually(t, "the retired key leaves the Set after its last token", func() bool {
		ka, kb := keyIDs(a), keyIDs(b)
		return len(ka) == 2 && slices.Equal(ka, kb) && ka[0] == first[1]
	})
	leader, other := a, b
	if b.store.IsLeader() {
		leader, other = b, a
	}
	if l, o := testkit.Metric(t, leader.reg, jwtsecret.LeaderMetric), testkit.Metric(t, other.reg, jwtsecret.LeaderMetric); l != 1 || o != 0 {
		t.Errorf("%s: leader %v, other %v; want 1 and 0", jwtsecret.LeaderMetric, l, o)
	}
	if w := testkit.Metric(t, leader.reg, "meshid_ca_jwt_key_secret_writes_total"); w != 3 {
		t.Errorf("the leader wrote %v times, want 3 (create, rotate, retire)", w)
	}
}

// heldLease is a Lease that another replica holds for an hour.
func heldLease() *coordinationv1.Lease {
	now := metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: jwtsecret.DefaultLeaseName, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("ca-other"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now,
		},
	}
}

func keySecret(t *testing.T, data []byte) *corev1.Secret {
	t.Helper()
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: jwtsecret.DefaultSecretName, Namespace: ns},
		Type:       jwtsecret.SecretType,
		Data:       map[string][]byte{jwtsecret.DataKey: data},
	}
}

// A replica that does not hold the Lease never writes, even when a
// rotation is due or the Secret is broken: it signs with the pre-published
// next key and keeps its last good keys.
func TestNonLeaderNeverWritesAndKeepsGoodKeys(t *testing.T) {
	clk := clock.NewFake(time.Now())
	set, _, err := jwtkeys.Rotate(nil, clk.Now(), life, ttl)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := jwtkeys.Encode(set)
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(heldLease(), keySecret(t, enc))
	r := start(t, client, clk, "ca-1")
	kubetest.Eventually(t, "the replica loads the Secret", func() bool { return len(keyIDs(r)) == 2 })
	iss := issuer(t, r, clk)
	clk.Add(life) // the first key retires; nobody rotates
	tok, err := iss.Issue(id, []string{"a"})
	if err != nil || tok.KeyID != set.Keys[1].ID {
		t.Errorf("after a lifetime without a leader: %v, key %v, want the pre-published %s", err, tok, set.Keys[1].ID)
	}
	sym := `{"version":1,"keys":[{"from":"2026-01-01T00:00:00Z","until":"2026-01-02T00:00:00Z","jwk":{"kty":"oct","k":"c2VjcmV0","kid":"x"}}]}`
	huge := make([]byte, jwtkeys.MaxEncodedSize+1)
	for n, bad := range [][]byte{[]byte("not json"), []byte(sym), huge} {
		if _, err := client.CoreV1().Secrets(ns).Update(context.Background(), keySecret(t, bad), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		kubetest.Eventually(t, "the invalid version is seen", func() bool {
			v, _ := testkit.LookupMetric(t, r.reg, "meshid_ca_jwt_key_secret_loads_total", "result", "invalid")
			return v == float64(n+1)
		})
		if got := keyIDs(r); !slices.Equal(got, []string{set.Keys[0].ID, set.Keys[1].ID}) {
			t.Errorf("after invalid version %d the replica holds %v", n, got)
		}
	}
	if r.store.IsLeader() {
		t.Fatal("the replica took a held Lease")
	}
	if w := secretWrites(client); w != 3 { // the test's own three updates
		t.Errorf("%d Secret writes, want only the test's 3: a non-leader wrote", w)
	}
}

// The leader replaces a Secret it cannot parse with new keys when it has
// none, and with the keys it holds when an attacker (or an operator's
// mistake) overwrites or deletes the Secret later, so tokens already issued
// keep validating.
func TestLeaderRepairsTheSecret(t *testing.T) {
	client := fake.NewClientset(keySecret(t, []byte(`{"version":1,"keys":[{"jwk":{"kty":"oct","k":"c2VjcmV0"}}]}`)))
	clk := clock.NewFake(time.Now())
	r := start(t, client, clk, "ca-0")
	kubetest.Eventually(t, "the leader writes valid keys over the invalid Secret", func() bool { return len(keyIDs(r)) == 2 })
	held := keyIDs(r)
	secrets := client.CoreV1().Secrets(ns)
	inSecret := func() []string {
		sec, err := secrets.Get(context.Background(), jwtsecret.DefaultSecretName, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		set, err := jwtkeys.Parse(sec.Data[jwtsecret.DataKey])
		if err != nil {
			return nil
		}
		return setIDs(set)
	}
	if _, err := secrets.Update(context.Background(), keySecret(t, []byte("garbage")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.Eventually(t, "the overwritten Secret holds the leader's keys again", func() bool { return slices.Equal(inSecret(), held) })
	if err := secrets.Delete(context.Background(), jwtsecret.DefaultSecretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.Eventually(t, "the deleted Secret is back with the same keys", func() bool { return slices.Equal(inSecret(), held) })
	if got := keyIDs(r); !slices.Equal(got, held) {
		t.Errorf("the leader now holds %v, want %v", got, held)
	}
}

func TestConfigValidation(t *testing.T) {
	client := fake.NewClientset()
	a := election.Candidate{Identity: "a"}
	for name, cfg := range map[string]jwtsecret.Config{
		"no client":     {Namespace: ns, Candidate: a, TTL: ttl},
		"no namespace":  {Client: client, Candidate: a, TTL: ttl},
		"no identity":   {Client: client, Namespace: ns, TTL: ttl},
		"no ttl":        {Client: client, Namespace: ns, Candidate: a},
		"short life":    {Client: client, Namespace: ns, Candidate: a, TTL: ttl, Lifetime: time.Minute},
		"negative wait": {Client: client, Namespace: ns, Candidate: a, TTL: ttl, RetryInterval: -1},
	} {
		if _, err := jwtsecret.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
