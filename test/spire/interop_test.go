package spire_test

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

var (
	meshTD  = spiffeid.RequireTrustDomainFromString("a.example")
	spireTD = spiffeid.RequireTrustDomainFromString("spire.example")
	// SPIRE's server presents this X509-SVID at its bundle endpoint.
	spireEndpointID = spiffeid.RequireFromPath(spireTD, "/spire/server")
	meshWorkload    = spiffeid.RequireFromPath(meshTD, "/ns/shop/sa/frontend")
	spireWorkload   = spiffeid.RequireFromPath(spireTD, "/billing")
)

// Issue 31's interoperability proof: meshid (a.example, the CA and agent
// assemblies) and a real SPIRE (spire.example, spire-server and
// spire-agent) federate with each other over https_spiffe, in both
// directions, each bootstrapped with the other's bundle the way the spec
// says (out of band, then fetched from the endpoint and verified with the
// newest bundle held). Then:
//   - SPIRE fetched meshid's bundle from meshid's endpoint: its agent serves
//     a.example's JWT keys, which were in no bootstrap (SPIRE was handed
//     meshid's PEM roots only), and a JWT-SVID of meshid's agent validates
//     against them;
//   - meshid fetched SPIRE's: its agent serves spire.example's roots, and a
//     JWT-SVID of SPIRE's agent validates against the JWT bundles meshid's
//     agent serves;
//   - a SPIRE-issued X509-SVID and a meshid-issued one complete mTLS with
//     each other, in both roles, each side authorizing the other's SPIFFE ID
//     in the other trust domain with the bundles its own agent serves; and a
//     meshid workload that authorizes only its own trust domain refuses
//     SPIRE's;
//   - Envoy's view: ROOTCA_FEDERATED of meshid's SDS holds spire.example's
//     roots under their own name, and SPIRE's SVID verifies with them.
func TestFederationWithSPIRE(t *testing.T) {
	bin := binDir(t)
	// meshid's root and its bundle endpoint's address, known before SPIRE
	// starts (SPIRE is configured with them).
	meshDir := t.TempDir()
	if _, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: meshDir, TrustDomain: meshTD.Name(), KeyType: certs.ECP256}); err != nil {
		t.Fatal(err)
	}
	meshEndpoint := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))

	srv := startSPIREServer(t, bin, spireTD.Name(), meshTD.Name(), "https://"+meshEndpoint, spiffefed.EndpointID(meshTD).String())
	// Bootstrap, SPIRE to meshid: SPIRE's bundle in the SPIFFE format.
	spireBundle := filepath.Join(meshDir, "spire-bundle.json")
	if err := os.WriteFile(spireBundle, []byte(srv.cli(t, "bundle", "show", "-format", "spiffe")), 0o600); err != nil {
		t.Fatal(err)
	}

	ca, iss, logs := startMeshCA(t, meshDir, meshEndpoint, spiffefed.Peer{
		TrustDomain: spireTD, URL: "https://127.0.0.1:" + strconv.Itoa(srv.bundlePort) + "/", Profile: spiffefed.ProfileSPIFFE,
		EndpointID: spireEndpointID, BundleFile: spireBundle,
	})
	logs.WaitFor(t, "federated bundle updated", 1)
	if st := ca.Federation(); len(st) != 1 || st[0].TrustDomain != spireTD.Name() || st[0].LastSuccess.IsZero() {
		t.Fatalf("meshid's federation status %+v", st)
	}

	// Bootstrap, meshid to SPIRE: meshid's roots (PEM, no JWT keys); then
	// SPIRE fetches the whole bundle from meshid's endpoint, verifying it
	// with those roots.
	srv.cli(t, "bundle", "set", "-format", "pem", "-id", "spiffe://"+meshTD.Name(), "-path", filepath.Join(meshDir, keystore.RootCertFile))
	srv.cli(t, "federation", "refresh", "-id", meshTD.Name())

	// SPIRE's workload: the test process itself (the unix attestor sees
	// its uid), under a node the join token names, federated with a.example.
	node := spiffeid.RequireFromPath(spireTD, "/node").String()
	srv.cli(t, "entry", "create", "-parentID", node, "-spiffeID", spireWorkload.String(),
		"-selector", "unix:uid:"+strconv.Itoa(os.Getuid()), "-federatesWith", "spiffe://"+meshTD.Name())
	spireSock := startSPIREAgent(t, srv, node)
	meshSock, meshSDS := startMeshAgent(t, ca, iss, meshDir)

	spireSrc, meshSrc := x509Source(t, spireSock), x509Source(t, meshSock)
	spireClient, meshClient := wlClient(t, spireSock), wlClient(t, meshSock)

	// SPIRE fetched a.example's bundle from meshid's endpoint: its JWT
	// keys reach SPIRE's agent, and meshid's JWT-SVID validates there.
	meshJWT, err := meshClient.FetchJWTSVID(ctxFor(t), jwtsvid.Params{Audience: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := jwtsvid.ParseAndValidate(meshJWT.Marshal(), waitJWTBundle(t, spireClient, meshTD), []string{"billing"}); err != nil || got.ID != meshWorkload {
		t.Fatalf("meshid's JWT-SVID at SPIRE's agent: %v, %v", got, err)
	}
	// And the reverse: SPIRE's JWT-SVID at meshid's agent.
	spireJWT, err := spireClient.FetchJWTSVID(ctxFor(t), jwtsvid.Params{Audience: "frontend"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := jwtsvid.ParseAndValidate(spireJWT.Marshal(), waitJWTBundle(t, meshClient, spireTD), []string{"frontend"}); err != nil || got.ID != spireWorkload {
		t.Fatalf("SPIRE's JWT-SVID at meshid's agent: %v, %v", got, err)
	}

	// mTLS between the two SVIDs, each side with its own agent's bundle of
	// the other trust domain, in both roles.
	spire := workload(t, spireSrc, meshTD)
	mesh := workload(t, meshSrc, spireTD)
	if spire.ID != spireWorkload || mesh.ID != meshWorkload {
		t.Fatalf("SVIDs %s and %s", spire.ID, mesh.ID)
	}
	for _, c := range []struct {
		name           string
		server, client testkit.Workload
	}{{"SPIRE serves, meshid dials", spire, mesh}, {"meshid serves, SPIRE dials", mesh, spire}} {
		srvErr, cliErr, sawClient, sawServer := testkit.Handshake(t, c.server, c.client, c.client.ID, c.server.ID)
		if srvErr != nil || cliErr != nil || sawClient != c.client.ID || sawServer != c.server.ID {
			t.Fatalf("%s: server %v (saw %s), client %v (saw %s)", c.name, srvErr, sawClient, cliErr, sawServer)
		}
	}
	// Envoy's view: ROOTCA_FEDERATED of meshid's SDS holds spire.example's
	// roots under its own name, and SPIRE's SVID verifies with them alone.
	roots := sdsTrustBundles(t, meshSDS)
	if len(roots) != 2 || len(roots[meshTD.Name()]) == 0 {
		t.Fatalf("ROOTCA_FEDERATED: %d trust domains", len(roots))
	}
	if _, _, err := x509svid.Verify(spire.SVID.Certificates, x509bundle.FromX509Authorities(spireTD, roots[spireTD.Name()])); err != nil {
		t.Fatalf("SPIRE's SVID with ROOTCA_FEDERATED's spire.example bundle: %v", err)
	}
	// A meshid workload with only its own trust domain's roots refuses
	// SPIRE's SVID: the roots of spire.example came from federation.
	own, err := meshSrc.GetX509BundleForTrustDomain(meshTD)
	if err != nil {
		t.Fatal(err)
	}
	if _, cliErr, _, _ := testkit.Handshake(t, spire, testkit.Workload{ID: mesh.ID, SVID: mesh.SVID, Bundle: own}, mesh.ID, spire.ID); cliErr == nil {
		t.Fatal("meshid's workload accepted SPIRE's SVID with a.example's roots only")
	}
}

// startMeshCA runs meshid's CA for a.example (root in dir) with its bundle
// endpoint on endpoint, federating with peer.
func startMeshCA(t *testing.T, dir, endpoint string, peer spiffefed.Peer) (*caserver.Server, *devissuer.Issuer, *testkit.LogRecorder) {
	t.Helper()
	iss, err := devissuer.LoadOrCreate(dir, "https://issuer."+meshTD.Name())
	if err != nil {
		t.Fatal(err)
	}
	logs := testkit.NewLogRecorder()
	ca, err := caserver.New(caserver.Config{
		Listen: "127.0.0.1:0", TrustDomain: meshTD, StateDir: dir,
		Authn: caserver.AuthnConfig{
			JWTIssuer: iss.Issuer(),
			JWKSFile:  filepath.Join(dir, devissuer.JWKSFile),
		},

		Federation: caserver.FederationConfig{
			BundleEndpoint: spiffefed.EndpointConfig{Listen: endpoint},
			Peers:          []spiffefed.Peer{peer},
		},
		Logger: logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "meshid CA", ca.Run)
	return ca, iss, logs
}

// startMeshAgent runs meshid's agent for shop/frontend and returns its
// Workload API socket.
func startMeshAgent(t *testing.T, ca *caserver.Server, iss *devissuer.Issuer, dir string) (wl, sds string) {
	t.Helper()
	tok, err := iss.Mint("shop", "frontend", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	sockDir := testkit.ShortDir(t)
	wl, sds = filepath.Join(sockDir, "wl.sock"), filepath.Join(sockDir, "sds.sock")
	testkit.RunAgent(t, agent.Config{
		CAAddr: ca.Addr().String(), CARootFile: filepath.Join(dir, keystore.RootCertFile), TokenFile: tokenFile,
		TrustDomain: meshTD, WorkloadAPISocket: wl, SDSSocket: sds, FederationRefresh: time.Second,
	})
	return wl, sds
}

// sdsTrustBundles asks meshid's SDS socket for ROOTCA_FEDERATED, as Envoy
// would, and returns the SPIFFE validator's trust bundles by trust domain.
func sdsTrustBundles(t *testing.T, sock string) map[string][]*x509.Certificate {
	t.Helper()
	resp, err := secretv3.NewSecretDiscoveryServiceClient(testkit.DialUnix(t, sock)).FetchSecrets(ctxFor(t), &discoveryv3.DiscoveryRequest{
		Node: &corev3.Node{Id: "sidecar~10.0.0.1~frontend.shop~shop.svc.cluster.local"}, ResourceNames: []string{secretcache.FederatedRootName}, TypeUrl: testkit.SecretTypeURL,
	})
	if err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("SDS %s: %d resources, %v", secretcache.FederatedRootName, len(resp.GetResources()), err)
	}
	var s tlsv3.Secret
	if err := resp.GetResources()[0].UnmarshalTo(&s); err != nil {
		t.Fatal(err)
	}
	var vc tlsv3.SPIFFECertValidatorConfig
	if err := s.GetValidationContext().GetCustomValidatorConfig().GetTypedConfig().UnmarshalTo(&vc); err != nil {
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

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), slow)
	t.Cleanup(cancel)
	return ctx
}

func x509Source(t *testing.T, sock string) *workloadapi.X509Source {
	t.Helper()
	src, err := workloadapi.NewX509Source(ctxFor(t), workloadapi.WithClientOptions(workloadapi.WithAddr("unix://"+sock)))
	if err != nil {
		t.Fatalf("X509Source on %s: %v", sock, err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func wlClient(t *testing.T, sock string) *workloadapi.Client {
	t.Helper()
	c, err := workloadapi.New(ctxFor(t), workloadapi.WithAddr("unix://"+sock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// workload is what src serves a workload: its SVID, and the bundle of the
// peer's trust domain (the one federation brought).
func workload(t *testing.T, src *workloadapi.X509Source, peer spiffeid.TrustDomain) testkit.Workload {
	t.Helper()
	svid, err := src.GetX509SVID()
	if err != nil {
		t.Fatal(err)
	}
	b := waitX509Bundle(t, src, peer)
	return testkit.Workload{ID: svid.ID, SVID: svid, Bundle: b}
}

// waitX509Bundle waits until src holds td's X.509 bundle.
func waitX509Bundle(t *testing.T, src *workloadapi.X509Source, td spiffeid.TrustDomain) *x509bundle.Bundle {
	t.Helper()
	ctx := ctxFor(t)
	for {
		if b, err := src.GetX509BundleForTrustDomain(td); err == nil {
			return b
		}
		if err := src.WaitUntilUpdated(ctx); err != nil {
			t.Fatalf("no X.509 bundle of %s: %v", td, err)
		}
	}
}

// jwtWatcher hands each JWT bundle set the agent streams to a channel
// until ctx ends.
type jwtWatcher struct {
	ctx context.Context
	ch  chan *jwtbundle.Set
}

func (w jwtWatcher) OnJWTBundlesUpdate(s *jwtbundle.Set) {
	select {
	case w.ch <- s:
	case <-w.ctx.Done():
	}
}
func (jwtWatcher) OnJWTBundlesWatchError(error) {}

// waitJWTBundle follows the agent's JWT bundles until td's holds a key.
func waitJWTBundle(t *testing.T, c *workloadapi.Client, td spiffeid.TrustDomain) *jwtbundle.Set {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	w := jwtWatcher{ctx: ctx, ch: make(chan *jwtbundle.Set)}
	go c.WatchJWTBundles(ctx, w)
	for {
		select {
		case s := <-w.ch:
			if b, ok := s.Get(td); ok && len(b.JWTAuthorities()) > 0 {
				return s
			}
		case <-ctx.Done():
			t.Fatalf("no JWT keys of %s within %v", td, slow)
		}
	}
}
