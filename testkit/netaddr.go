package testkit

import (
	"net"
	"net/http"
	"testing"
)

// NonLoopbackIP is an IPv4 address of this host that is not loopback, for
// connecting to a listener on every interface as a peer that is not
// local; "" when the host has none (the caller then skips that check).
func NonLoopbackIP() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

// HTTPGet GETs url and returns the status code and body (HTTP's GET).
func HTTPGet(t testing.TB, url string) (int, string) {
	t.Helper()
	return HTTP(t, http.MethodGet, url)
}
