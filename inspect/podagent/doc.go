// Package podagent reaches the meshid agent of a pod from outside the
// cluster, the way `istioctl proxy-config` reaches a proxy: it looks the
// pod up through the API server, finds the agent's container and its
// monitoring port (from its --monitoring-listen argument, else the agent's
// default), port-forwards to it and makes one GET. The agent answers
// /debug/ paths to loopback peers only, which a port-forward is.
//
// It links client-go, so only the full meshid CLI imports it, never the
// agent.
package podagent
