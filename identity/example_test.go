package identity_test

import (
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/identity"
)

// A Kubernetes service account's SPIFFE ID, and back.
func ExampleServiceAccount_ID() {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	sa := identity.ServiceAccount{Namespace: "shop", Name: "checkout"}
	id, err := sa.ID(td)
	if err != nil {
		panic(err)
	}
	fmt.Println(id)
	back, err := identity.FromID(id)
	fmt.Println(back, err)
	// Output:
	// spiffe://cluster.local/ns/shop/sa/checkout
	// shop/checkout <nil>
}

// The service account a TokenReview's user name names.
func ExampleFromUsername() {
	sa, ok := identity.FromUsername("system:serviceaccount:shop:checkout")
	fmt.Println(sa, ok, sa.Username())
	_, ok = identity.FromUsername("system:node:worker-1")
	fmt.Println(ok)
	// Output:
	// shop/checkout true system:serviceaccount:shop:checkout
	// false
}

// The TLS server name an Istio agent verifies for a CA address.
func ExampleCAServerName() {
	fmt.Println(identity.CAServerName("meshid.istio-system.svc:15012"))
	fmt.Println(identity.CAServerName("localhost:15012"))
	// Output:
	// meshid.istio-system.svc
	// istiod.istio-system.svc
}
