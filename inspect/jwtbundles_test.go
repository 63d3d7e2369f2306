package inspect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/inspect"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/sds/workloadendpoint"
	"github.com/meshid/meshid/testkit"
)

// workloadAPI serves the Workload API of a SecretManager (with jwt, JWT
// methods too) on a real Unix socket, and returns the socket.
func workloadAPI(t *testing.T, td spiffeid.TrustDomain, jwt secretcache.JWTSigner) string {
	t.Helper()
	id := spiffeid.RequireFromPath(td, "/ns/shop/sa/cart")
	m, err := secretcache.New(secretcache.Config{Signer: testkit.AuthoritySigner{Authority: testkit.NewAuthority(t, td, nil, nil)}, ID: id, JWTSigner: jwt})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(testkit.ShortDir(t), "wl.sock")
	srv, err := workloadendpoint.New(workloadendpoint.Config{Source: m, SocketPath: sock})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "workload api", m.Run, srv.Run)
	return sock
}

// TestWorkloadAPIJWTBundles: `inspect --workload-api` lists the JWT
// bundle's keys (trust domain, kid, alg, key type) under the X.509 table,
// and in JSON; a Workload API without JWT-SVIDs adds nothing.
func TestWorkloadAPIJWTBundles(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := iss.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var want jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	sock := workloadAPI(t, td, testkit.JWTSigner{Issuer: iss})
	keys, err := inspect.FetchWorkloadAPIJWTBundles(t.Context(), sock, testkit.Guard)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(want.Keys) || len(keys) != 2 {
		t.Fatalf("keys %+v, want the issuer's %d", keys, len(want.Keys))
	}
	for _, k := range keys {
		if k.TrustDomain != "cluster.local" || k.Algorithm != "ES256" || k.KeyType != "EC P-256" || len(want.Key(k.KeyID)) != 1 {
			t.Errorf("key %+v", k)
		}
	}
	var out bytes.Buffer
	rep, err := inspect.Run(t.Context(), inspect.Config{
		Sources: []inspect.Source{func(ctx context.Context) ([]*inspect.Input, error) {
			return inspect.FetchWorkloadAPI(ctx, sock, testkit.Guard)
		}},
		JWTSources: []inspect.JWTSource{func(ctx context.Context) ([]inspect.JWTKey, error) {
			return inspect.FetchWorkloadAPIJWTBundles(ctx, sock, testkit.Guard)
		}},
		Out: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "svid ") || !strings.Contains(s, "JWT BUNDLE") || !strings.Contains(s, "jwt-bundle:cluster.local   "+keys[0].KeyID) || len(rep.JWTBundles) != 2 {
		t.Errorf("table:\n%s", s)
	}
	out.Reset()
	if err := inspect.WriteJSON(&out, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"jwt_bundles"`) || !strings.Contains(out.String(), `"kid": "`+keys[1].KeyID) {
		t.Errorf("JSON:\n%s", out.String())
	}

	// An agent whose CA mints no JWT-SVIDs: no keys, no error.
	none := workloadAPI(t, td, nil)
	if keys, err := inspect.FetchWorkloadAPIJWTBundles(t.Context(), none, testkit.Guard); err != nil || len(keys) != 0 {
		t.Errorf("without JWT-SVIDs: %v, %v", keys, err)
	}
}
