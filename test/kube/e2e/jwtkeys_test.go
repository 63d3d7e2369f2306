package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"google.golang.org/grpc/metadata"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/kube/jwtsecret"
	"github.com/meshid/meshid/internal/jwtapi"
)

// resetJWTKeys deletes the shared JWT key Secret and its Lease.
func resetJWTKeys(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	c := cluster.Client()
	if err := c.CoreV1().Secrets(caNamespace).Delete(ctx, jwtsecret.DefaultSecretName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := c.CoordinationV1().Leases(caNamespace).Delete(ctx, jwtsecret.DefaultLeaseName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// mintJWT asks s for a JWT-SVID for audience, proving the caller with token.
func (s *caServer) mintJWT(ctx context.Context, token, audience string) (string, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	resp, err := jwtapi.NewClient(s.conn).MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{audience}})
	if err != nil {
		return "", err
	}
	if len(resp.GetSvids()) != 1 {
		return "", fmt.Errorf("%d JWT-SVIDs in the response", len(resp.GetSvids()))
	}
	return resp.GetSvids()[0].GetSvid(), nil
}

// jwtBundle fetches s's JWT bundle (no credentials needed).
func (s *caServer) jwtBundle(ctx context.Context) (*jwtbundle.Bundle, error) {
	resp, err := jwtapi.NewClient(s.conn).FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
	if err != nil {
		return nil, err
	}
	raw, ok := resp.GetBundles()[trustDomain.IDString()]
	if !ok {
		return nil, errors.New("no bundle for the trust domain")
	}
	return jwtbundle.Parse(trustDomain, raw)
}

// crossValidates mints a JWT-SVID through from and validates it against
// the bundle fetched from to.
func crossValidates(ctx context.Context, from, to *caServer, token, audience string) error {
	tok, err := from.mintJWT(ctx, token, audience)
	if err != nil {
		return fmt.Errorf("mint: %w", err)
	}
	b, err := to.jwtBundle(ctx)
	if err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	if _, err := jwtsvid.ParseAndValidate(tok, b, []string{audience}); err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	return nil
}

// TestJWTKeysSharedByReplicas runs two `meshid server` processes as the
// meshid ServiceAccount, with exactly the RBAC of deploy/, and checks that
// a JWT-SVID minted by either validates against the bundle served by the
// other: the replicas share their signing keys through the Secret the
// leader of the meshid-jwt-keys Lease writes. That leader alone reports
// meshid_ca_jwt_key_leader 1 and alone wrote the Secret, while each replica
// also serves meshid_ca_leader for its other elector, the CA's Lease
// meshid-ca (1 on that Lease's holder only). Then, as an attacker with
// write access to the Secret, it replaces the keys with a symmetric key: no
// replica loads it, and the leader writes its keys back over it.
func TestJWTKeysSharedByReplicas(t *testing.T) {
	ctx := context.Background()
	kubeconfig := deployRBAC(t)
	resetJWTKeys(t)
	t.Cleanup(func() { resetJWTKeys(t) })
	resetCAState(t) // the CA's own Lease too: two electors in one process
	t.Cleanup(func() { resetCAState(t) })
	replicas := map[string]*caServer{}
	for _, name := range []string{"jwt-0", "jwt-1"} {
		r := startCA(t, kubeconfig, "--namespace", caNamespace, "--pod-name", name,
			"--root-configmap-namespaces", publishLabel+"=jwt-keys") // no namespace: the ConfigMaps are not under test
		r.connect(t, r.stateRoots(t))
		replicas[name] = r
	}
	a, b := replicas["jwt-0"], replicas["jwt-1"]
	w := newWorkload(t, "jwt-keys")
	token := w.token(t, "istio-ca")
	const wait = 60 * time.Second

	eventually(t, wait, "a token of jwt-0 validates with jwt-1's bundle and back", func(ctx context.Context) error {
		if err := crossValidates(ctx, a, b, token, "orders"); err != nil {
			return fmt.Errorf("jwt-0 -> jwt-1: %w", err)
		}
		if err := crossValidates(ctx, b, a, token, "orders"); err != nil {
			return fmt.Errorf("jwt-1 -> jwt-0: %w", err)
		}
		return nil
	})

	// Each Lease has its own leader gauge in the one registry: the holder
	// of meshid-jwt-keys alone reports meshid_ca_jwt_key_leader 1, the holder
	// of meshid-ca alone meshid_ca_leader 1.
	var jwtLeader string
	eventually(t, wait, "the JWT key Lease's holder alone reports "+jwtsecret.LeaderMetric+" 1", func(ctx context.Context) error {
		var err error
		jwtLeader, err = gaugeLeader(ctx, replicas, jwtsecret.DefaultLeaseName, jwtsecret.LeaderMetric)
		return err
	})
	eventually(t, wait, "the CA Lease's holder alone reports meshid_ca_leader 1", func(ctx context.Context) error {
		_, err := gaugeLeader(ctx, replicas, "meshid-ca", "meshid_ca_leader")
		return err
	})

	secrets := cluster.Client().CoreV1().Secrets(caNamespace)
	sec, err := secrets.Get(ctx, jwtsecret.DefaultSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Type != jwtsecret.SecretType {
		t.Errorf("Secret type %q, want %q", sec.Type, jwtsecret.SecretType)
	}
	before, err := jwtkeys.Parse(sec.Data[jwtsecret.DataKey])
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range replicas {
		v, err := metric(r.monitor, "meshid_ca_jwt_key_secret_writes_total")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := map[bool]float64{true: 1}[name == jwtLeader]; v != want {
			t.Errorf("%s wrote the Secret %v times, want %v (once, the create, by the leader %s)", name, v, want, jwtLeader)
		}
	}

	// The attacker's write: a symmetric key. Every replica keeps signing
	// with keys the other trusts; the leader writes the keys it holds back,
	// so tokens issued before keep validating.
	early, err := a.mintJWT(ctx, token, "inventory")
	if err != nil {
		t.Fatal(err)
	}
	sec.Data = map[string][]byte{jwtsecret.DataKey: []byte(`{"version":1,"keys":[{"from":"2026-01-01T00:00:00Z","until":"2027-01-01T00:00:00Z","jwk":{"kty":"oct","k":"c2VjcmV0","kid":"x"}}]}`)}
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, wait, "the leader writes its keys back over the attacker's", func(ctx context.Context) error {
		s, err := secrets.Get(ctx, jwtsecret.DefaultSecretName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		after, err := jwtkeys.Parse(s.Data[jwtsecret.DataKey])
		if err != nil {
			return err
		}
		if after.Keys[0].ID != before.Keys[0].ID {
			return fmt.Errorf("the Secret holds key %s first, want the leader's %s back", after.Keys[0].ID, before.Keys[0].ID)
		}
		return nil
	})
	eventually(t, wait, "both replicas sign with the new keys and trust each other", func(ctx context.Context) error {
		if err := crossValidates(ctx, a, b, token, "payments"); err != nil {
			return err
		}
		return crossValidates(ctx, b, a, token, "payments")
	})
	if bundle, err := b.jwtBundle(ctx); err != nil {
		t.Error(err)
	} else if _, err := jwtsvid.ParseAndValidate(early, bundle, []string{"inventory"}); err != nil {
		t.Errorf("a token issued before the attack: %v", err)
	}
	for name, r := range replicas {
		if v, err := metricValue(r.monitor, "meshid_ca_jwt_key_secret_loads_total", `result="invalid"`); err != nil || v < 1 {
			t.Errorf("%s: invalid loads %v (%v), want at least 1", name, v, err)
		}
	}
}
