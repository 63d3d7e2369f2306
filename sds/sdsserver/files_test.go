package sdsserver_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// The attack over the socket: a client asks for the agent's own files
// (the CA key of meshid dev) as file resources. With no allowed directory
// they are refused, and FetchSecrets, SotW and delta answer exactly as
// they do for an absent file, so that the socket tells nothing about which
// files exist.
func TestFileResourcesNoOracle(t *testing.T) {
	p := newPKI(t, nil)
	allowed, secret := t.TempDir(), t.TempDir()
	keyPEM, err := certs.EncodePrivateKey(p.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, caKey := filepath.Join(secret, "ca-cert.pem"), filepath.Join(secret, "ca-key.pem")
	for path, data := range map[string][]byte{caCert: certs.EncodeCertificates(p.roots()...), caKey: keyPEM} {
		if err := certs.WriteFileAtomic(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := secretcache.New(secretcache.Config{Signer: p, ID: testID, FileSecretDirs: []string{allowed}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "Manager", m.Run)
	h := start(t, m)

	absent := secretcache.FileRootPrefix + filepath.Join(allowed, "absent.pem")
	existing := []string{
		secretcache.FileRootPrefix + caCert,
		secretcache.FileCertPrefix + caCert + "~" + caKey,
		secretcache.FileRootPrefix + allowed + "/../" + filepath.Base(secret) + "/ca-cert.pem",
	}
	fetch := func(name string) (codes.Code, string) {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
		defer cancel()
		_, err := h.client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{ResourceNames: []string{name}})
		st := status.Convert(err)
		return st.Code(), strings.ReplaceAll(st.Message(), name, "NAME")
	}
	wantCode, wantMsg := fetch(absent)
	if wantCode != codes.NotFound {
		t.Fatalf("FetchSecrets of an absent file: %v, want NotFound", wantCode)
	}
	for _, name := range existing {
		if c, msg := fetch(name); c != wantCode || msg != wantMsg {
			t.Errorf("FetchSecrets(%q) = %v %q, an absent file's = %v %q", name, c, msg, wantCode, wantMsg)
		}
	}

	// Delta reports each as removed, like the absent file; SotW sends
	// nothing for any of them, only default.
	d := newDelta(t, h.client, nil)
	d.change(append([]string{absent}, existing...), nil)
	var removed []string
	for len(removed) < len(existing)+1 {
		r := d.recv()
		if len(r.GetResources()) != 0 {
			t.Fatalf("delta sent %v", r.GetResources())
		}
		removed = append(removed, r.GetRemovedResources()...)
	}
	c := newSotw(t, h.client, nil)
	c.request(append(append([]string{absent}, existing...), dflt)...)
	if s := c.recvSecret(); s.GetName() != dflt {
		t.Fatalf("SotW sent %q", s.GetName())
	}
	if strings.Contains(h.logs.All(), string(keyPEM[40:80])) {
		t.Fatal("key material in the logs")
	}
}
