package boundtoken

import (
	"context"
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

const testIssuer = "https://kubernetes.default.svc.cluster.local"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// apiServer serves the two discovery documents the way kube-apiserver
// does (the jwks_uri names an external host; only its path is used), and
// counts the JWKS reads.
type apiServer struct {
	mu        sync.Mutex
	keys      []*ecdsa.PrivateKey
	rsaKeys   []*rsa.PrivateKey // served with alg RS256, as most clusters sign
	forbidden bool
	jwksReads atomic.Int64
	srv       *httptest.Server
}

func newAPIServer(t testing.TB) *apiServer {
	a := &apiServer{}
	a.addKey(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		if a.deny(w) {
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"issuer": testIssuer, "jwks_uri": "https://203.0.113.1:6443/openid/v1/jwks"})
	})
	mux.HandleFunc("/openid/v1/jwks", func(w http.ResponseWriter, r *http.Request) {
		if a.deny(w) {
			return
		}
		a.jwksReads.Add(1)
		a.mu.Lock()
		defer a.mu.Unlock()
		var set jose.JSONWebKeySet
		for _, k := range a.keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: kid(k), Algorithm: "ES256", Use: "sig"})
		}
		for _, k := range a.rsaKeys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: rsaKid(k), Algorithm: "RS256", Use: "sig"})
		}
		json.NewEncoder(w).Encode(set)
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *apiServer) deny(w http.ResponseWriter) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.forbidden {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden: User cannot get path","reason":"Forbidden","code":403}`))
	}
	return a.forbidden
}

func (a *apiServer) addKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = append(a.keys, k.(*ecdsa.PrivateKey))
	return k.(*ecdsa.PrivateKey)
}

// addRSAKey adds an RSA-2048 signing key (kid rsaKid) to the JWKS.
func (a *apiServer) addRSAKey(t testing.TB) *rsa.PrivateKey {
	k, err := certs.GenerateKey(certs.RSA2048)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rsaKeys = append(a.rsaKeys, k.(*rsa.PrivateKey))
	return k.(*rsa.PrivateKey)
}

func rsaKid(k *rsa.PrivateKey) string { return "rsa-" + k.N.Text(16)[:8] }

func (a *apiServer) key() *ecdsa.PrivateKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.keys[0]
}

func (a *apiServer) rest(t testing.TB) rest.Interface {
	cs, err := kubeclient.New(&rest.Config{Host: a.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return cs.CoreV1().RESTClient()
}

func kid(k *ecdsa.PrivateKey) string {
	return "kid-" + k.X.Text(16)[:8]
}

func meta(kind, ns, name, uid string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
	}
}

// env is a Verifier on a fake API server and a fake metadata client
// holding service account shop/cart and its pod cart-0.
type env struct {
	v   *Verifier
	api *apiServer
	md  *metadatafake.FakeMetadataClient
	clk *clock.Fake
	reg *prometheus.Registry
	ctx context.Context
}

func defaultObjects() []runtime.Object {
	return []runtime.Object{
		meta("ServiceAccount", "shop", "cart", "sa-uid"),
		meta("Pod", "shop", "cart-0", "pod-uid"),
		meta("Secret", "shop", "cart-secret", "secret-uid"),
	}
}

// newEnv builds and starts a Verifier (discovery done, informers synced
// unless the API server forbids discovery).
func newEnv(t testing.TB, mod func(*Config), objs ...runtime.Object) *env {
	t.Helper()
	if objs == nil {
		objs = defaultObjects()
	}
	e := &env{api: newAPIServer(t), clk: clock.NewFake(t0), reg: prometheus.NewRegistry()}
	scheme := metadatafake.NewTestScheme()
	metav1.AddMetaToScheme(scheme)
	e.md = metadatafake.NewSimpleMetadataClient(scheme, objs...)
	cfg := Config{REST: e.api.rest(t), Metadata: e.md, Clock: e.clk, Registerer: e.reg}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeLocal
	}
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.v = v
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.ctx = ctx
	go v.objects.run(ctx)
	if !v.objects.waitForSync(ctx) {
		t.Fatal("informers did not sync")
	}
	_ = v.Refresh(ctx)
	return e
}

// tokenClaims are the claims of a genuine pod-bound token for shop/cart.
func tokenClaims(now time.Time) map[string]any {
	return map[string]any{
		"iss": testIssuer, "sub": "system:serviceaccount:shop:cart", "aud": []string{"istio-ca"},
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      "shop",
			"serviceaccount": map[string]any{"name": "cart", "uid": "sa-uid"},
			"pod":            map[string]any{"name": "cart-0", "uid": "pod-uid"},
			"node":           map[string]any{"name": "node-a", "uid": "node-uid"},
		},
	}
}

func sign(t testing.TB, key any, alg jose.SignatureAlgorithm, kid string, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// genuine signs claims with the API server's key, as the API server would.
func (e *env) genuine(t testing.TB, claims map[string]any) string {
	k := e.api.key()
	return sign(t, k, jose.ES256, kid(k), claims)
}
