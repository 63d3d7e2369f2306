package freshtokens

import (
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

func TestParseRequests(t *testing.T) {
	page := []byte(`# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="authentication.k8s.io",resource="tokenreviews",scope="cluster",subresource="",verb="POST",version="v1"} 12
apiserver_request_total{code="500",component="apiserver",dry_run="",group="authentication.k8s.io",resource="tokenreviews",scope="cluster",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 4
apiserver_request_totally_other{resource="pods"} 99
`)
	got, err := parseRequests(page)
	if err != nil {
		t.Fatal(err)
	}
	if got["tokenreviews"] != 15 || got["pods"] != 1 || got[""] != 4 || len(got) != 3 {
		t.Fatalf("parsed %v", got)
	}
	d := Delta(map[string]float64{"tokenreviews": 10, "pods": 1}, got)
	if d["tokenreviews"] != 5 || d[""] != 4 || len(d) != 2 {
		t.Fatalf("delta %v", d)
	}
	if _, err := parseRequests([]byte("apiserver_request_total{resource=\"pods\"} x\n")); err == nil {
		t.Fatal("a malformed value was accepted")
	}
}

func TestNewValidates(t *testing.T) {
	c := fake.NewClientset()
	for name, cfg := range map[string]Config{
		"no client":   {Count: 1},
		"no count":    {Client: c},
		"short token": {Client: c, Count: 1, TokenTTL: 5 * 60e9},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	f, err := New(Config{Client: c, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if f.Namespace() != DefaultNamespace || f.ServiceAccount() != DefaultServiceAccount {
		t.Fatalf("defaults: %+v", f.cfg)
	}
}
