package harness

import (
	"time"

	"fmt"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func (c *Cluster) writeKubeconfig(path string, certPEM, keyPEM []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["harness"] = &clientcmdapi.Cluster{
		Server:                   c.host,
		CertificateAuthorityData: encodeCert(c.pki.caCert),
	}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: certPEM,
		ClientKeyData:         keyPEM,
		Token:                 token,
	}
	cfg.Contexts["harness"] = &clientcmdapi.Context{Cluster: "harness", AuthInfo: "user"}
	cfg.CurrentContext = "harness"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("harness: write kubeconfig: %w", err)
	}
	return nil
}

// TokenKubeconfig writes <dir>/<name>.kubeconfig that authenticates with a
// bearer token (for instance a service account's) and returns its path.
func (c *Cluster) TokenKubeconfig(name, token string) (string, error) {
	path := filepath.Join(c.dir, name+".kubeconfig")
	return path, c.writeKubeconfig(path, nil, nil, token)
}

// UserKubeconfig writes <dir>/<name>.kubeconfig with a fresh client
// certificate for user in groups and returns its path.
func (c *Cluster) UserKubeconfig(name, user string, groups []string) (string, error) {
	certPEM, keyPEM, err := c.pki.clientCert(user, groups, time.Now())
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, name+".kubeconfig")
	return path, c.writeKubeconfig(path, certPEM, keyPEM, "")
}

// TokenConfig is a client config that authenticates with token. Its rate
// limits are the admin client's: client-go's default when they are left
// zero (QPS 5, burst 10) would make a test measure the client's token
// bucket instead of the API server.
func (c *Cluster) TokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            c.host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: encodeCert(c.pki.caCert)},
		QPS:             c.admin.QPS,
		Burst:           c.admin.Burst,
	}
}

// ImpersonatingClient is an admin client that acts as user in groups, the
// way `kubectl --as` does: RBAC decisions are made for that user.
func (c *Cluster) ImpersonatingClient(user string, groups []string) (kubernetes.Interface, error) {
	cfg := c.AdminConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("harness: impersonating client: %w", err)
	}
	return client, nil
}
