package inspect

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-jose/go-jose/v4"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// JWTKey is one key of a JWT bundle: what `-o json` prints under
// jwt_bundles, and a row of the JWT bundle table.
type JWTKey struct {
	TrustDomain string `json:"trust_domain"`
	KeyID       string `json:"kid"`
	Algorithm   string `json:"alg"`      // "" when the bundle does not say
	KeyType     string `json:"key_type"` // "EC P-256", "RSA 2048", "OKP Ed25519"
}

// JWTSource reads JWT bundle keys (--workload-api).
type JWTSource func(ctx context.Context) ([]JWTKey, error)

// FetchWorkloadAPIJWTBundles reads the JWT bundles the SPIFFE Workload API
// on the Unix socket serves (its first FetchJWTBundles message). The raw
// JWKS is read, not go-spiffe's parsed bundle, which drops each key's
// "alg". A server without JWT-SVIDs (Unimplemented, or Unavailable as
// meshid's agent answers when its CA mints none) has no keys, not an
// error.
func FetchWorkloadAPIJWTBundles(ctx context.Context, socket string, timeout time.Duration) ([]JWTKey, error) {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("inspect: Workload API %s: %v", socket, err)
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("inspect: Workload API %s: %v", socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true"), timeout)
	defer cancel()
	stream, err := workloadpb.NewSpiffeWorkloadAPIClient(conn).FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
	var resp *workloadpb.JWTBundlesResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	switch status.Code(err) {
	case codes.OK:
	case codes.Unimplemented, codes.Unavailable:
		return nil, nil
	default:
		return nil, fmt.Errorf("inspect: Workload API %s: JWT bundles: %v", socket, err)
	}
	return JWTKeys(resp.GetBundles())
}

// JWTKeys lists the keys of JWKS bundles keyed by trust domain (SPIFFE ID
// or name), sorted by trust domain.
func JWTKeys(bundles map[string][]byte) ([]JWTKey, error) {
	var out []JWTKey
	for name, raw := range bundles {
		td := name
		if t, err := spiffeid.TrustDomainFromString(name); err == nil {
			td = t.Name()
		}
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(raw, &set); err != nil {
			return nil, fmt.Errorf("inspect: JWT bundle %s: %v", td, err)
		}
		for _, k := range set.Keys {
			out = append(out, JWTKey{TrustDomain: td, KeyID: k.KeyID, Algorithm: k.Algorithm, KeyType: keyType(k.Key)})
		}
	}
	slices.SortStableFunc(out, func(a, b JWTKey) int {
		return strings.Compare(a.TrustDomain+"\x00"+a.KeyID, b.TrustDomain+"\x00"+b.KeyID)
	})
	return out, nil
}

func keyType(k any) string {
	switch k := k.(type) {
	case *ecdsa.PublicKey:
		return "EC " + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	case ed25519.PublicKey:
		return "OKP Ed25519"
	default:
		return fmt.Sprintf("%T", k)
	}
}

// WriteJWTKeys writes the JWT bundle table: one row per key.
func WriteJWTKeys(w io.Writer, keys []JWTKey) error {
	ew := &errWriter{w: w}
	tw := tabwriter.NewWriter(ew, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "JWT BUNDLE\tKID\tALG\tKEY TYPE\n")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", "jwt-bundle:"+k.TrustDomain, k.KeyID, cmpOrDash(k.Algorithm), k.KeyType)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return ew.err
}

func cmpOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
