package nodeauth_test

import (
	"slices"
	"testing"

	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/identity"
)

func TestParseTrustedAccounts(t *testing.T) {
	zt := identity.ServiceAccount{Namespace: "istio-system", Name: "ztunnel"}
	ks := identity.ServiceAccount{Namespace: "kube-system", Name: "ztunnel"}
	ok := []struct {
		in   string
		want []identity.ServiceAccount
	}{
		{"", nil},
		{" , ", nil},
		{"istio-system/ztunnel", []identity.ServiceAccount{zt}},
		{"istio-system/ztunnel, kube-system/ztunnel ,", []identity.ServiceAccount{zt, ks}},
		{"istio-system/ztunnel,istio-system/ztunnel", []identity.ServiceAccount{zt}},
	}
	for _, tc := range ok {
		got, err := nodeauth.ParseTrustedAccounts(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseTrustedAccounts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"ztunnel", "/ztunnel", "istio-system/", "a/b/c", "istio-system:ztunnel", "istio-system/ztunnel,bad"} {
		if got, err := nodeauth.ParseTrustedAccounts(in); err == nil {
			t.Errorf("ParseTrustedAccounts(%q) = %v, want an error", in, got)
		}
	}
}
