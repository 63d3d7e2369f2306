// Package sdsfetch is a one-shot SDS client: it connects to an Envoy Secret
// Discovery Service over a Unix socket, asks for named secrets the way a
// proxy does (a StreamSecrets stream per name, ACKed; FetchSecrets when the
// server has no streaming), and returns them as typed certificates and
// keys. It works against meshid's agent, istio-agent, SPIRE's agent or any
// other SDS server. `meshid inspect --sds` uses it.
package sdsfetch
