package secretdump_test

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretdump"
)

func TestRoundTripAndRefusals(t *testing.T) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	root, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{CommonName: "r"}, Key: key, NotBefore: now, TTL: time.Hour, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	want := secretdump.Dump{Identity: "spiffe://td/x", Ready: true, Secrets: []secretdump.Secret{
		secretdump.Chain("default", "v1", []*x509.Certificate{root}, root.NotAfter),
		secretdump.Roots("ROOTCA", "v2", []*x509.Certificate{root}, root.NotAfter),
	}}
	srv := httptest.NewServer(secretdump.Handler(func() secretdump.Dump { return want }))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Error("cacheable")
	}
	d, err := secretdump.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Secrets {
		cs, err := s.Certificates()
		if err != nil || !cs[0].Equal(root) {
			t.Fatalf("%s: %v", s.Name, err)
		}
	}
	bad := func(mut func(*secretdump.Dump)) []byte {
		c := want
		c.Secrets = append([]secretdump.Secret(nil), want.Secrets...)
		mut(&c)
		b, _ := json.Marshal(c)
		return b
	}
	for name, data := range map[string][]byte{
		"not JSON":     []byte("<html>"),
		"empty":        []byte("{}"),
		"huge":         append([]byte(`{"identity":"`), bytes.Repeat([]byte("a"), secretdump.MaxSize)...),
		"unknown type": bad(func(d *secretdump.Dump) { d.Secrets[0].Type = "generic_secret" }),
		"bad PEM":      bad(func(d *secretdump.Dump) { d.Secrets[1].TrustedCA = "-----BEGIN CERTIFICATE-----\nxx" }),
	} {
		if _, err := secretdump.Parse(data); err == nil {
			t.Errorf("%s: parsed", name)
		} else if strings.Count(err.Error(), "\n") != 0 {
			t.Errorf("%s: multi-line error %q", name, err)
		}
	}
}
