package e2e_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"

	"github.com/meshid/meshid/testkit"
)

// Issue 3, done when: with `meshid dev` running, a client speaking SDS on
// the socket gets default and ROOTCA; the chain verifies and its SPIFFE ID
// is spiffe://cluster.local/ns/default/sa/default. Over the
// state-of-the-world stream, the incremental stream and the unary fetch.
func TestDevAgentServesSDS(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	c := sdsClient(t, d.sock)
	want := mustID(t, "default", "default")
	rootPEM, err := os.ReadFile(d.root)
	if err != nil {
		t.Fatal(err)
	}
	fileBundle, err := x509bundle.Load(td, d.root)
	if err != nil {
		t.Fatal(err)
	}

	// check verifies one delivery of default and ROOTCA and returns the
	// leaf's serial.
	check := func(t *testing.T, def, roots *tlsv3.Secret) string {
		t.Helper()
		svid := svidOf(t, def)
		bundle := bundleOf(t, roots)
		if !sameCerts(bundle.X509Authorities(), parseCerts(t, rootPEM)) {
			t.Fatal("ROOTCA is not the root in <state-dir>/root-cert.pem")
		}
		verifySVID(t, svid, bundle, time.Time{}, want)
		verifySVID(t, svid, fileBundle, time.Time{}, want)
		if !time.Now().Before(svid.Certificates[0].NotAfter) {
			t.Fatal("an expired certificate was served")
		}
		return svid.Certificates[0].SerialNumber.String()
	}

	var serials []string
	t.Run("StreamSecrets", func(t *testing.T) {
		s := openSotw(t, c, "default", "ROOTCA")
		got := s.recvNames("default", "ROOTCA")
		serials = append(serials, check(t, got["default"], got["ROOTCA"]))
	})

	t.Run("DeltaSecrets", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		ds, err := c.DeltaSecrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ds.Send(&discoveryv3.DeltaDiscoveryRequest{
			Node:                   &corev3.Node{Id: "sidecar~10.0.0.2~delta.default~default.svc.cluster.local"},
			TypeUrl:                secretTypeURL,
			ResourceNamesSubscribe: []string{"default", "ROOTCA"},
		}); err != nil {
			t.Fatal(err)
		}
		got := map[string]*tlsv3.Secret{}
		for len(got) < 2 {
			r, err := ds.Recv()
			if err != nil {
				t.Fatalf("recv: %v", err)
			}
			if r.GetTypeUrl() != secretTypeURL || r.GetNonce() == "" {
				t.Fatalf("malformed delta response: %v", r)
			}
			for _, res := range r.GetResources() {
				sec := &tlsv3.Secret{}
				if err := res.GetResource().UnmarshalTo(sec); err != nil {
					t.Fatal(err)
				}
				if res.GetName() != sec.GetName() || res.GetVersion() == "" {
					t.Fatalf("delta resource %q (version %q) holds secret %q", res.GetName(), res.GetVersion(), sec.GetName())
				}
				got[sec.GetName()] = sec
			}
			if err := ds.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: secretTypeURL, ResponseNonce: r.GetNonce()}); err != nil {
				t.Fatal(err)
			}
		}
		if got["default"] == nil || got["ROOTCA"] == nil {
			t.Fatalf("delta delivered %v, want default and ROOTCA", got)
		}
		serials = append(serials, check(t, got["default"], got["ROOTCA"]))
	})

	t.Run("FetchSecrets", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		r, err := c.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{TypeUrl: secretTypeURL, ResourceNames: []string{"default", "ROOTCA"}})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*tlsv3.Secret{}
		for _, a := range r.GetResources() {
			sec := &tlsv3.Secret{}
			if err := a.UnmarshalTo(sec); err != nil {
				t.Fatal(err)
			}
			got[sec.GetName()] = sec
		}
		if got["default"] == nil || got["ROOTCA"] == nil {
			t.Fatalf("fetch returned %v, want default and ROOTCA", got)
		}
		serials = append(serials, check(t, got["default"], got["ROOTCA"]))
	})

	t.Run("monitoring", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz"} {
			for _, addr := range []string{d.caMonitor, d.agentMonitor} {
				if code, _ := testkit.HTTP(t, http.MethodGet, "http://"+addr+path); code != http.StatusOK {
					t.Fatalf("GET %s%s: %d", addr, path, code)
				}
			}
		}
		if n := metricSum(t, d.caMonitor, "meshid_ca_certificates_issued_total"); n < 1 {
			t.Fatalf("the CA counts %v issued certificates", n)
		}
		if n := metricSum(t, d.agentMonitor, "meshid_agent_rotations_total"); n != 1 {
			t.Fatalf("the agent counts %v certificates obtained, want 1", n)
		}
		if s := metricSum(t, d.agentMonitor, "meshid_agent_cert_expiry_seconds"); s < 23*3600 || s > 24*3600 {
			t.Fatalf("the agent's certificate expires in %vs, want about 24h", s)
		}
	})

	// One agent, one cached certificate, whatever the protocol.
	if len(serials) != 3 {
		return // a subtest failed
	}
	for _, s := range serials[1:] {
		if s != serials[0] {
			t.Fatalf("serials %v: the streams were not served the one cached certificate", serials)
		}
	}
}

// metricSum scrapes addr's /metrics and returns the sum of name's samples
// (counters and gauges).
func metricSum(t *testing.T, addr, name string) float64 {
	t.Helper()
	code, body := testkit.HTTP(t, http.MethodGet, "http://"+addr+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d", addr, code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s/metrics: %v", addr, err)
	}
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("%s/metrics has no %s", addr, name)
	}
	sum := 0.0
	for _, m := range mf.GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}
