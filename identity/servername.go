package identity

import (
	"net"
	"strings"
)

// IstiodName is the name Istio's agent verifies when the CA address is a
// localhost one; meshid's CA serving certificate carries it.
const IstiodName = "istiod.istio-system.svc"

// CAServerName returns the TLS server name Istio's agent verifies for a CA
// address: its host (of host:port, or of a gRPC target such as
// dns:///host:port), except that a host containing "localhost" becomes
// istiod.istio-system.svc.
func CAServerName(addr string) string {
	if i := strings.Index(addr, ":///"); i >= 0 { // a gRPC target such as dns:///host:port
		addr = addr[i+4:]
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.Contains(host, "localhost") {
		return IstiodName
	}
	return host
}
