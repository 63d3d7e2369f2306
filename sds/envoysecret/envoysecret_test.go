package envoysecret_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/envoysecret"
)

func TestTypeURLIsTheGeneratedMessage(t *testing.T) {
	if want := "type.googleapis.com/" + string(proto.MessageName(&tlsv3.Secret{})); envoysecret.TypeURL != want {
		t.Fatalf("TypeURL = %q, want %q", envoysecret.TypeURL, want)
	}
}

// What the server encodes, the client decodes to the same values: the
// chain and key, the bundle as trusted_ca and as the SPIFFE validator.
func TestRoundTrip(t *testing.T) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	root, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: "root"}, Key: key, NotBefore: time.Now().Add(-time.Hour), TTL: time.Hour * 2})
	if err != nil {
		t.Fatal(err)
	}
	roots := []*x509.Certificate{root}

	tc, err := envoysecret.TLSCertificate("default", roots, key)
	if err != nil {
		t.Fatal(err)
	}
	s, err := envoysecret.Parse(tc)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "default" || s.Kind != envoysecret.KindTLSCertificate || len(s.Chain) != 1 || !s.Chain[0].Equal(root) || !certs.KeyMatches(root.PublicKey, s.Key) {
		t.Fatalf("certificate round trip: %+v", s)
	}

	vc := envoysecret.ValidationContext("ROOTCA", roots)
	sv, err := envoysecret.SPIFFEValidator("ROOTCA", spiffeid.RequireTrustDomainFromString("cluster.local"), roots)
	if err != nil {
		t.Fatal(err)
	}
	if cv := sv.GetValidationContext().GetCustomValidatorConfig(); cv.GetName() != envoysecret.SPIFFEValidatorName {
		t.Fatalf("SPIFFE validator named %q", cv.GetName())
	}
	for _, sec := range []*tlsv3.Secret{vc, sv} {
		r, err := envoysecret.Parse(sec)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind != envoysecret.KindValidationContext || len(r.Roots) != 1 || !r.Roots[0].Equal(root) || r.Key != nil {
			t.Fatalf("root round trip: %+v", r)
		}
	}
	// Errors name the field.
	tc.GetTlsCertificate().GetPrivateKey().Specifier = nil
	if _, err := envoysecret.Parse(tc); err == nil || err.Error() != "private_key: empty data source" {
		t.Fatalf("Parse of a key without data = %v", err)
	}
}
