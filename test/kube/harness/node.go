package harness

import (
	"time"

	"k8s.io/client-go/rest"
)

// authorizationArgs are the API server's authorization and admission flags:
// RBAC alone, or with Config.NodeAuthorization the Node authorizer before
// RBAC and the NodeRestriction admission plugin, as kubeadm runs them.
func authorizationArgs(cfg Config) []string {
	if !cfg.NodeAuthorization {
		return []string{"--authorization-mode=RBAC"}
	}
	return []string{
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
	}
}

// NodeConfig is a client config that authenticates as the kubelet of node
// nodeName: a fresh client certificate, signed by the cluster CA, for user
// system:node:<nodeName> in group system:nodes. With
// Config.NodeAuthorization the Node authorizer and NodeRestriction judge
// its requests. Its rate limits are the admin client's. It panics only if
// the system's random source fails (the key and serial come from it).
func (c *Cluster) NodeConfig(nodeName string) *rest.Config {
	certPEM, keyPEM, err := c.pki.clientCert("system:node:"+nodeName, []string{"system:nodes"}, time.Now())
	if err != nil {
		panic(err)
	}
	return &rest.Config{
		Host: c.host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   encodeCert(c.pki.caCert),
			CertData: certPEM,
			KeyData:  keyPEM,
		},
		QPS:   c.admin.QPS,
		Burst: c.admin.Burst,
	}
}
