package spiffefed_test

import (
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/spiffefed"
)

func TestParsePeer(t *testing.T) {
	p, err := spiffefed.ParsePeer("b.example=https://b.example:8443/,endpoint-id=spiffe://b.example/meshid/bundle-endpoint,bundle=/etc/b.json")
	if err != nil {
		t.Fatal(err)
	}
	if p.TrustDomain.Name() != "b.example" || p.URL != "https://b.example:8443/" || p.Profile != spiffefed.ProfileSPIFFE ||
		p.EndpointID.String() != "spiffe://b.example/meshid/bundle-endpoint" || p.BundleFile != "/etc/b.json" {
		t.Fatalf("parsed %+v", p)
	}
	w, err := spiffefed.ParsePeer("spire.example=https://spire.example/bundle,profile=https_web,ca-file=/etc/ca.pem")
	if err != nil || w.Profile != spiffefed.ProfileWeb || w.CAFile != "/etc/ca.pem" {
		t.Fatalf("https_web: %+v %v", w, err)
	}
	bad := map[string]string{
		"no equals":          "b.example",
		"bad trust domain":   "B_EXAMPLE=https://b/",
		"http":               "b.example=http://b.example/,profile=https_web",
		"no host":            "b.example=https:///x,profile=https_web",
		"user info":          "b.example=https://u:p@b.example/,profile=https_web",
		"spiffe without id":  "b.example=https://b.example/",
		"unknown option":     "b.example=https://b.example/,profile=https_web,colour=red",
		"unknown profile":    "b.example=https://b.example/,profile=ftp",
		"option twice":       "b.example=https://b.example/,profile=https_web,profile=https_web",
		"ca-file for spiffe": "b.example=https://b.example/,endpoint-id=spiffe://b.example/x,ca-file=/a",
		"id for web":         "b.example=https://b.example/,profile=https_web,endpoint-id=spiffe://b.example/x",
		"empty value":        "b.example=https://b.example/,profile=",
		"too long":           "b.example=https://b.example/" + strings.Repeat("a", spiffefed.MaxPeerSpec),
	}
	for name, v := range bad {
		if _, err := spiffefed.ParsePeer(v); err == nil {
			t.Errorf("%s: %q accepted", name, v)
		}
	}
	own := spiffeid.RequireTrustDomainFromString("a.example")
	web := "b.example=https://b.example/,profile=https_web"
	if _, err := spiffefed.ParsePeers([]string{web, web}, own); err == nil {
		t.Error("a trust domain given twice was accepted")
	}
	if _, err := spiffefed.ParsePeers([]string{"a.example=https://a.example/,profile=https_web"}, own); err == nil {
		t.Error("the CA's own trust domain was accepted as a peer")
	}
}
