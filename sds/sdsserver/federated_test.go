package sdsserver_test

import (
	"crypto/x509"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/sdsserver"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// spiffeBundles decodes a ROOTCA_FEDERATED secret: Envoy's SPIFFE
// validator, with its trust bundles by trust domain name.
func spiffeBundles(t *testing.T, s *tlsv3.Secret) map[string][]*x509.Certificate {
	t.Helper()
	custom := s.GetValidationContext().GetCustomValidatorConfig()
	if custom.GetName() != sdsserver.SPIFFEValidatorName || s.GetValidationContext().GetTrustedCa() != nil {
		t.Fatalf("%s: validator %q, trusted_ca %v", s.GetName(), custom.GetName(), s.GetValidationContext().GetTrustedCa())
	}
	var vc tlsv3.SPIFFECertValidatorConfig
	if err := custom.GetTypedConfig().UnmarshalTo(&vc); err != nil {
		t.Fatal(err)
	}
	out := map[string][]*x509.Certificate{}
	for _, td := range vc.GetTrustDomains() {
		cs, err := certs.ParseCertificates(td.GetTrustBundle().GetInlineBytes())
		if err != nil {
			t.Fatal(err)
		}
		out[td.GetName()] = cs
	}
	return out
}

// ROOTCA_FEDERATED is Envoy's SPIFFE validator with one trust bundle per
// trust domain (never a merged trusted_ca, whatever the node asks), and a
// change of a federated bundle is pushed to the stream at the agent's next
// poll; ROOTCA stays the mesh's own roots.
func TestFederatedRootsOverSDS(t *testing.T) {
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	tdB := spiffeid.RequireTrustDomainFromString("b.example")
	fed := &benchFederation{}
	var rootsB [2]*x509.Certificate
	for i := range fed.answers {
		rootsB[i] = newPKI(t, clk).roots()[0]
		data, err := spiffebundle.FromX509Authorities(tdB, rootsB[:i+1]).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		fed.answers[i] = map[string][]byte{tdB.IDString(): data}
	}
	authority := testkit.NewAuthority(t, td, clk, nil)
	m, err := secretcache.New(secretcache.Config{
		Signer: testkit.AuthoritySigner{Authority: authority},
		ID:     spiffeid.RequireFromPath(td, "/ns/default/sa/app"), Federation: fed, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, m, withClock(clk))
	testkit.Run(t, "manager", m.Run)
	c := newSotw(t, h.client, &corev3.Node{Id: "sidecar~10.0.0.1~pod.default~default.svc.cluster.local"})
	c.request(secretcache.FederatedRootName, secretcache.RootName)
	got := c.recvNamed(secretcache.FederatedRootName, secretcache.RootName)
	if roots := trustedCA(t, got[secretcache.RootName]); len(roots) != 1 || !roots[0].Equal(authority.Bundle().Roots[0]) {
		t.Fatalf("ROOTCA: %d roots", len(roots))
	}
	bundles := spiffeBundles(t, got[secretcache.FederatedRootName])
	for len(bundles) != 2 { // the first poll may answer after the first response
		c.ack()
		bundles = spiffeBundles(t, c.recvSecret())
	}
	if len(bundles["b.example"]) != 1 || !bundles["cluster.local"][0].Equal(authority.Bundle().Roots[0]) {
		t.Fatalf("ROOTCA_FEDERATED: %v", bundles)
	}
	c.ack()
	fed.cur.Store(1)
	testkit.WaitForTimers(t, clk, 2, "the renewal and the federation poll")
	clk.Add(secretcache.DefaultFederationRefresh)
	bundles = spiffeBundles(t, c.recvSecret())
	if len(bundles["b.example"]) != 2 || !bundles["b.example"][1].Equal(rootsB[1]) {
		t.Fatalf("after b.example's change: %d roots of b.example", len(bundles["b.example"]))
	}
}
