package cluster

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// DefaultMaxKubeconfigSize bounds one remote secret's kubeconfig: 64 KiB.
// What istioctl create-remote-secret writes (a server, a CA certificate
// and a token) is about 3 KiB; a larger value is refused before parsing.
const DefaultMaxKubeconfigSize = 64 << 10

// Options a remote secret's kubeconfig may use only when allowed
// (caserver.Config.Clusters.InsecureKubeconfigOptions, Istio's
// PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS): each runs a program or
// reads a file of the CA's pod, which whoever writes a Secret in the CA's
// namespace must not be able to make the CA do. An auth provider other
// than oidc is allowed by its name ("gcp", "azure", ...).
const (
	OptionExec                 = "exec"
	OptionTokenFile            = "tokenFile"
	OptionClientCertificate    = "clientCertificate"
	OptionClientKey            = "clientKey"
	OptionCertificateAuthority = "certificateAuthority"
)

// Sanitize returns the client config of kubeconfig data from a remote
// secret, or why it is refused: larger than max bytes (0 means
// DefaultMaxKubeconfigSize), not a kubeconfig, invalid, or using an option
// not in allow (see the Option constants). Like Istio's secret controller,
// it refuses exec and auth-provider plugins (but oidc) and file references
// of the user (tokenFile, client-certificate, client-key) and, unlike it,
// the certificate-authority file too; each user is rebuilt from the fields
// it knows, so that a field client-go adds later is not used unreviewed.
// Errors never quote the kubeconfig.
func Sanitize(data []byte, max int, allow []string) (*rest.Config, error) {
	if max <= 0 {
		max = DefaultMaxKubeconfigSize
	}
	switch {
	case len(data) == 0:
		return nil, errors.New("the kubeconfig is empty")
	case len(data) > max:
		return nil, fmt.Errorf("the kubeconfig is %d bytes, more than the %d KiB limit", len(data), max>>10)
	}
	raw, err := clientcmd.Load(data)
	if err != nil {
		// The parser's message may quote the input; say only what failed.
		return nil, errors.New("not a kubeconfig (YAML or JSON that does not parse as one)")
	}
	// Sanitize before Validate, which opens the files a kubeconfig names:
	// a refused reference must not even be looked at.
	if err := sanitize(raw, allow); err != nil {
		return nil, fmt.Errorf("kubeconfig refused: %w", err)
	}
	if err := clientcmd.Validate(*raw); err != nil {
		return nil, fmt.Errorf("invalid kubeconfig: %w", err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return rc, nil
}

func sanitize(cfg *clientcmdapi.Config, allow []string) error {
	allowed := func(opt string) bool { return slices.Contains(allow, opt) }
	for name, c := range cfg.Clusters {
		if c.CertificateAuthority != "" && !allowed(OptionCertificateAuthority) {
			return fmt.Errorf("cluster %q: certificate-authority (a file of the CA's pod) is not allowed; use certificate-authority-data", clip(name))
		}
	}
	for name, a := range cfg.AuthInfos {
		switch {
		case a.AuthProvider != nil && a.AuthProvider.Name != "oidc" && !allowed(a.AuthProvider.Name):
			return fmt.Errorf("user %q: auth provider %q is not allowed", clip(name), clip(a.AuthProvider.Name))
		case a.Exec != nil && !allowed(OptionExec):
			return fmt.Errorf("user %q: exec (runs a program in the CA's pod) is not allowed", clip(name))
		case a.TokenFile != "" && !allowed(OptionTokenFile):
			return fmt.Errorf("user %q: tokenFile (a file of the CA's pod) is not allowed; use token", clip(name))
		case a.ClientCertificate != "" && !allowed(OptionClientCertificate):
			return fmt.Errorf("user %q: client-certificate (a file of the CA's pod) is not allowed; use client-certificate-data", clip(name))
		case a.ClientKey != "" && !allowed(OptionClientKey):
			return fmt.Errorf("user %q: client-key (a file of the CA's pod) is not allowed; use client-key-data", clip(name))
		}
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{
			ClientCertificate:     a.ClientCertificate,
			ClientCertificateData: a.ClientCertificateData,
			ClientKey:             a.ClientKey,
			ClientKeyData:         a.ClientKeyData,
			Token:                 a.Token,
			TokenFile:             a.TokenFile,
			Impersonate:           a.Impersonate,
			ImpersonateUID:        a.ImpersonateUID,
			ImpersonateGroups:     a.ImpersonateGroups,
			ImpersonateUserExtra:  a.ImpersonateUserExtra,
			Username:              a.Username,
			Password:              a.Password,
			AuthProvider:          a.AuthProvider, // checked above
			Exec:                  a.Exec,         // checked above
		}
	}
	return nil
}
