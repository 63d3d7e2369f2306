package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// mesh is one trust domain: its CA (bundle endpoint on, federating with the
// other mesh over https_spiffe) and one agent with the Workload API.
type mesh struct {
	td        spiffeid.TrustDomain
	dir       string
	endpoint  string // the bundle endpoint's host:port, reserved
	ca        *caserver.Server
	agent     *agent.Agent
	wlSock    string
	sdsSock   string
	logs      *testkit.LogRecorder // the CA's
	adminSock string
	hint      time.Duration // of the bundle endpoint; 0: the default
}

// newMesh creates td's self-signed root (the one the CA will load) and
// reserves its bundle endpoint's port, so that the other mesh can be
// configured with both before either CA starts.
func newMesh(t *testing.T, td string) *mesh {
	t.Helper()
	m := &mesh{td: spiffeid.RequireTrustDomainFromString(td), dir: t.TempDir(), logs: testkit.NewLogRecorder()}
	m.adminSock = filepath.Join(testkit.ShortDir(t), "admin.sock")
	if _, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: m.dir, TrustDomain: td, KeyType: certs.ECP256}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.endpoint = ln.Addr().String()
	ln.Close()
	return m
}

// newCA builds the CA of m federating with peer (not started).
func (m *mesh) newCA(t *testing.T, peer *mesh) *devissuer.Issuer {
	t.Helper()
	iss, err := devissuer.LoadOrCreate(m.dir, "https://issuer."+m.td.Name())
	if err != nil {
		t.Fatal(err)
	}
	m.ca, err = caserver.New(caserver.Config{
		Listen: "127.0.0.1:0", TrustDomain: m.td, StateDir: m.dir, AdminSocket: m.adminSock,
		Authn: caserver.AuthnConfig{
			JWTIssuer: iss.Issuer(),
			JWKSFile:  filepath.Join(m.dir, devissuer.JWKSFile),
		},

		Federation: caserver.FederationConfig{
			BundleEndpoint: spiffefed.EndpointConfig{Listen: m.endpoint, RefreshHint: m.hint},
			Peers: []spiffefed.Peer{{
				TrustDomain: peer.td, URL: "https://" + peer.endpoint + "/", Profile: spiffefed.ProfileSPIFFE,
				EndpointID: spiffefed.EndpointID(peer.td), BundleFile: filepath.Join(peer.dir, keystore.RootCertFile),
			}},
		},
		Logger: m.logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

// startAgent runs m's agent for ns/sa, once its CA holds the peer's bundle.
func (m *mesh) startAgent(t *testing.T, iss *devissuer.Issuer, ns, sa string) {
	t.Helper()
	tok, err := iss.Mint(ns, sa, []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(m.dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := testkit.ShortDir(t)
	m.wlSock, m.sdsSock = filepath.Join(sock, "wl.sock"), filepath.Join(sock, "sds.sock")
	m.agent = testkit.RunAgent(t, agent.Config{
		CAAddr: m.ca.Addr().String(), CARootFile: filepath.Join(m.dir, keystore.RootCertFile), TokenFile: tokenFile,
		TrustDomain: m.td, SDSSocket: m.sdsSock, WorkloadAPISocket: m.wlSock,
		// A rotation's new root reaches ROOTCA (and the CA client) from
		// root-cert.pem; the federated bundles are asked for every second.
		CARootRefresh: time.Second, FederationRefresh: time.Second,
	})
}

// waitFederated waits until m's CA fetched the other trust domain's bundle.
func (m *mesh) waitFederated(t *testing.T) {
	t.Helper()
	m.logs.WaitFor(t, "federated bundle updated", 1)
	if st := m.ca.Federation(); len(st) != 1 || st[0].LastSuccess.IsZero() || st[0].Sequence == 0 {
		t.Fatalf("%s: federation status %+v", m.td, st)
	}
}

// adminStatus is what `meshid inspect --ca` prints of m's CA.
func (m *mesh) adminStatus(t *testing.T, sock string) string {
	t.Helper()
	st, err := admin.NewClient(sock, guard).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	st.Format(&out, time.Now())
	return out.String()
}

func (m *mesh) source(t *testing.T) *workloadapi.X509Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(workloadapi.WithAddr("unix://"+m.wlSock)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// Issue 31: two meshid meshes, a.example and b.example, each serving its
// bundle over https_spiffe and federating with the other: a workload of A
// and one of B complete mTLS using only what their agents serve (go-spiffe
// Workload API clients, each authorizing the other trust domain), and an
// SDS-configured client of A (default + ROOTCA_FEDERATED) reaches B's
// workload too; a JWT-SVID of B validates against the JWT bundles A's agent
// serves. Neither mesh's roots are filed under the other's name, and A's
// `meshid inspect --ca` view lists b.example.
func TestFederationBetweenTwoMeshes(t *testing.T) {
	a, b := newMesh(t, "a.example"), newMesh(t, "b.example")
	srcA, srcB := startMeshes(t, a, b)
	// The operator's view (meshid inspect --ca, the admin socket).
	if out := a.adminStatus(t, a.adminSock); !strings.Contains(out, "federation: 1 trust domain(s)") || !strings.Contains(out, "b.example  https://"+b.endpoint+"/ (https_spiffe)  refreshed") {
		t.Fatalf("inspect --ca of A:\n%s", out)
	}
	// Each agent serves the other domain's roots under its own name only.
	for _, c := range []struct {
		src       *workloadapi.X509Source
		own, peer *mesh
	}{{srcA, a, b}, {srcB, b, a}} {
		peerBundle := waitBundle(t, c.src, c.peer.td)
		ownBundle, _ := c.src.GetX509BundleForTrustDomain(c.own.td)
		if !sameCerts(peerBundle.X509Authorities(), c.peer.ca.Authority().Bundle().Roots) || !sameCerts(ownBundle.X509Authorities(), c.own.ca.Authority().Bundle().Roots) {
			t.Fatalf("%s's agent: the trust domains' roots are mixed up", c.own.td)
		}
	}

	idB, _ := spiffeid.FromPath(b.td, "/ns/pay/sa/ledger")
	// B serves, authorizing members of a.example; A dials, authorizing b.example.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(srcB, srcB, tlsconfig.AuthorizeMemberOf(a.td)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go echo(ln)
	if saw, err := dialEcho(ln.Addr().String(), tlsconfig.MTLSClientConfig(srcA, srcA, tlsconfig.AuthorizeMemberOf(b.td))); err != nil || saw != idB {
		t.Fatalf("A to B over the Workload API: saw %s, %v", saw, err)
	}
	// A client that authorizes only its own trust domain refuses B.
	if _, err := dialEcho(ln.Addr().String(), tlsconfig.MTLSClientConfig(srcA, srcA, tlsconfig.AuthorizeMemberOf(a.td))); err == nil {
		t.Fatal("A accepted B while authorizing only a.example")
	}

	// JWT-SVIDs: B's token validates against the bundles A's agent serves,
	// under b.example.
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	clientA, err := workloadapi.New(ctx, workloadapi.WithAddr("unix://"+a.wlSock))
	if err != nil {
		t.Fatal(err)
	}
	defer clientA.Close()
	clientB, err := workloadapi.New(ctx, workloadapi.WithAddr("unix://"+b.wlSock))
	if err != nil {
		t.Fatal(err)
	}
	defer clientB.Close()
	tok, err := clientB.FetchJWTSVID(ctx, jwtsvid.Params{Audience: "orders.a.example"})
	if err != nil {
		t.Fatal(err)
	}
	jwtBundles := waitJWTBundle(t, ctx, clientA, b.td)
	if got, err := jwtsvid.ParseAndValidate(tok.Marshal(), jwtBundles, []string{"orders.a.example"}); err != nil || got.ID != idB {
		t.Fatalf("B's JWT-SVID at A: %v, %v", got, err)
	}

	// The SDS side: what Envoy would be given (default, and
	// ROOTCA_FEDERATED with one trust bundle per domain).
	cert, bundles := sdsFederated(t, a.sdsSock)
	if len(bundles) != 2 || !sameCerts(bundles[b.td.Name()], b.ca.Authority().Bundle().Roots) || !sameCerts(bundles[a.td.Name()], a.ca.Authority().Bundle().Roots) {
		t.Fatalf("ROOTCA_FEDERATED: %d trust domains", len(bundles))
	}
	set := x509bundle.NewSet()
	for td, roots := range bundles {
		set.Add(x509bundle.FromX509Authorities(spiffeid.RequireTrustDomainFromString(td), roots))
	}
	sdsClient := tlsconfig.MTLSClientConfig(x509svidSource{cert}, set, tlsconfig.AuthorizeID(idB))
	if saw, err := dialEcho(ln.Addr().String(), sdsClient); err != nil || saw != idB {
		t.Fatalf("A's SDS client to B: saw %s, %v", saw, err)
	}
}

// waitBundle waits until src holds td's bundle: the agent asks its CA
// for the federated bundles as it starts, beside its first certificate.
func waitBundle(t *testing.T, src *workloadapi.X509Source, td spiffeid.TrustDomain) *x509bundle.Bundle {
	t.Helper()
	timeout := time.After(guard)
	for {
		if b, err := src.GetX509BundleForTrustDomain(td); err == nil {
			return b
		}
		select {
		case <-src.Updated():
		case <-timeout:
			t.Fatalf("no bundle of %s from the Workload API within %v", td, guard)
		}
	}
}

// jwtWatcher passes on every JWT bundle set the Workload API streams.
type jwtWatcher chan *jwtbundle.Set

func (w jwtWatcher) OnJWTBundlesUpdate(s *jwtbundle.Set) {
	select {
	case w <- s:
	default:
	}
}

func (jwtWatcher) OnJWTBundlesWatchError(error) {}

// waitJWTBundle waits until the JWT bundles c's agent streams hold td's
// keys (a change the agent sees at its next federated poll).
func waitJWTBundle(t *testing.T, ctx context.Context, c *workloadapi.Client, td spiffeid.TrustDomain) *jwtbundle.Set {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := make(jwtWatcher, 1)
	go c.WatchJWTBundles(ctx, w)
	for {
		select {
		case set := <-w:
			if set.Has(td) {
				return set
			}
		case <-ctx.Done():
			t.Fatalf("no JWT bundle of %s from the Workload API within %v", td, guard)
		}
	}
}

type x509svidSource struct{ svid *x509svid.SVID }

func (s x509svidSource) GetX509SVID() (*x509svid.SVID, error) { return s.svid, nil }

func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 4)
			if _, err := io.ReadFull(c, buf); err == nil {
				c.Write(buf)
			}
		}()
	}
}

// dialEcho connects with cfg, exchanges one message and returns the
// server's SPIFFE ID.
func dialEcho(addr string, cfg *tls.Config) (spiffeid.ID, error) {
	d := tls.Dialer{Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return spiffeid.ID{}, err
	}
	defer conn.Close()
	tc := conn.(*tls.Conn)
	id, err := x509svid.IDFromCert(tc.ConnectionState().PeerCertificates[0])
	if err != nil {
		return id, err
	}
	if _, err := tc.Write([]byte("ping")); err != nil {
		return id, err
	}
	buf := make([]byte, 4)
	_, err = io.ReadFull(tc, buf)
	return id, err
}

// sdsFederated asks the agent's SDS socket for default and
// ROOTCA_FEDERATED, as Envoy would, and returns the SVID and the SPIFFE
// validator's trust bundles by trust domain name.
func sdsFederated(t *testing.T, sock string) (*x509svid.SVID, map[string][]*x509.Certificate) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	names := []string{secretcache.DefaultName, secretcache.FederatedRootName}
	resp, err := secretv3.NewSecretDiscoveryServiceClient(testkit.DialUnix(t, sock)).FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "sidecar~10.0.0.1~frontend.shop~shop.svc.cluster.local"}, ResourceNames: names, TypeUrl: testkit.SecretTypeURL,
	})
	if err != nil {
		t.Fatal(err)
	}
	var svid *x509svid.SVID
	bundles := map[string][]*x509.Certificate{}
	for _, r := range resp.GetResources() {
		var s tlsv3.Secret
		if err := r.UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		switch s.GetName() {
		case secretcache.DefaultName:
			tc := s.GetTlsCertificate()
			if svid, err = x509svid.Parse(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes()); err != nil {
				t.Fatal(err)
			}
		case secretcache.FederatedRootName:
			custom := s.GetValidationContext().GetCustomValidatorConfig()
			if custom.GetName() != "envoy.tls.cert_validator.spiffe" {
				t.Fatalf("ROOTCA_FEDERATED validator %q", custom.GetName())
			}
			var vc tlsv3.SPIFFECertValidatorConfig
			if err := custom.GetTypedConfig().UnmarshalTo(&vc); err != nil {
				t.Fatal(err)
			}
			for _, td := range vc.GetTrustDomains() {
				cs, err := certs.ParseCertificates(td.GetTrustBundle().GetInlineBytes())
				if err != nil {
					t.Fatal(err)
				}
				bundles[td.GetName()] = cs
			}
		}
	}
	if svid == nil || len(bundles) == 0 {
		t.Fatalf("SDS answered %d resources without default or ROOTCA_FEDERATED", len(resp.GetResources()))
	}
	return svid, bundles
}

// startMeshes starts a.example and b.example federated with each other,
// each with an agent, and returns the agents' Workload API sources once
// each holds the other's bundle.
func startMeshes(t *testing.T, a, b *mesh) (srcA, srcB *workloadapi.X509Source) {
	t.Helper()
	issA, issB := a.newCA(t, b), b.newCA(t, a)
	for _, m := range []*mesh{a, b} {
		if err := m.ca.Listen(); err != nil { // both endpoints bound before either fetches
			t.Fatal(err)
		}
	}
	testkit.Run(t, "CAs", a.ca.Run, b.ca.Run)
	a.waitFederated(t)
	b.waitFederated(t)
	a.startAgent(t, issA, "shop", "frontend")
	b.startAgent(t, issB, "pay", "ledger")
	srcA, srcB = a.source(t), b.source(t)
	waitBundle(t, srcA, b.td)
	waitBundle(t, srcB, a.td)
	return srcA, srcB
}

// waitRoots waits until src's bundle of td holds n roots.
func waitRoots(t *testing.T, src *workloadapi.X509Source, td spiffeid.TrustDomain, n int, what string) {
	t.Helper()
	timeout := time.After(guard)
	for {
		if b, err := src.GetX509BundleForTrustDomain(td); err == nil && len(b.X509Authorities()) == n {
			return
		}
		select {
		case <-src.Updated():
		case <-timeout:
			t.Fatalf("%s: the bundle of %s does not hold %d roots within %v", what, td, n, guard)
		}
	}
}

// Issue 31: B rotates its root (the existing rotation flow) while its
// workload and A's keep talking: B's bundle endpoint serves the new root
// as soon as it is prepared, A's CA fetches it at B's refresh hint, A's
// agent hands it to A's workload, and every handshake across the
// rotation, in both directions, succeeds, the last on B's new root.
func TestFederationAcrossARootRotation(t *testing.T) {
	a, b := newMesh(t, "a.example"), newMesh(t, "b.example")
	b.hint = time.Second // refreshed at spiffefed.MinRefresh (5 s)
	srcA, srcB := startMeshes(t, a, b)
	serve := func(src *workloadapi.X509Source, allow spiffeid.TrustDomain) string {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsconfig.MTLSServerConfig(src, src, tlsconfig.AuthorizeMemberOf(allow)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go echo(ln)
		return ln.Addr().String()
	}
	atB, atA := serve(srcB, a.td), serve(srcA, b.td)
	failed := 0
	handshakes := func(step string) {
		t.Helper()
		if _, err := dialEcho(atB, tlsconfig.MTLSClientConfig(srcA, srcA, tlsconfig.AuthorizeMemberOf(b.td))); err != nil {
			failed++
			t.Errorf("%s: A to B: %v", step, err)
		}
		if _, err := dialEcho(atA, tlsconfig.MTLSClientConfig(srcB, srcB, tlsconfig.AuthorizeMemberOf(a.td))); err != nil {
			failed++
			t.Errorf("%s: B to A: %v", step, err)
		}
	}
	handshakes("before")
	if err := b.ca.Rotation().RotateRoot(); err != nil {
		t.Fatal(err)
	}
	newRoot := b.ca.Rotation().Status().Prepared
	handshakes("prepared")
	waitRoots(t, srcA, b.td, 2, "A's workload")
	waitRoots(t, srcB, b.td, 2, "B's workload")
	handshakes("both of B's roots everywhere")
	if err := b.ca.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	if err := b.agent.Manager().Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(guard)
	for {
		if svid, err := srcB.GetX509SVID(); err == nil && svid.Certificates[len(svid.Certificates)-1].CheckSignatureFrom(newRoot) == nil {
			break
		}
		select {
		case <-srcB.Updated():
		case <-timeout:
			t.Fatal("B's workload did not get a certificate of the new root")
		}
	}
	handshakes("B on its new root")
	if failed != 0 {
		t.Fatalf("%d failed handshakes across B's rotation", failed)
	}
}
