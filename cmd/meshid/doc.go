// Command meshid is the meshid CA (server), node agent (agent), the embedded
// default that runs both (dev), and the certificate tooling (inspect, certs,
// bench).
//
// This package is wiring only: it turns flags and istiod/istio-agent
// environment fallbacks into the Config structs of the packages that do the
// work, and is the only place that reads flags or the environment.
package main
