package cluster_test

import (
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/cluster"
)

// kubeconfig returns a kubeconfig whose one user has the given YAML lines.
func kubeconfig(server, clusterExtra, user string) []byte {
	return []byte(`apiVersion: v1
kind: Config
clusters:
- name: b
  cluster:
    server: ` + server + `
    insecure-skip-tls-verify: true
` + clusterExtra + `
contexts:
- name: b
  context: {cluster: b, user: b}
current-context: b
users:
- name: b
  user:
` + user + "\n")
}

const secretToken = "s3cr3t-token-value-never-logged"

func TestSanitizeAcceptsWhatIstioctlWrites(t *testing.T) {
	rc, err := cluster.Sanitize(kubeconfig("https://b.example:6443", "", "    token: "+secretToken), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://b.example:6443" || rc.BearerToken != secretToken {
		t.Fatalf("host %q token set %v", rc.Host, rc.BearerToken != "")
	}
	oidc := "    auth-provider:\n      name: oidc\n      config: {client-id: x, id-token: tok, idp-issuer-url: 'https://idp.example'}"
	if _, err := cluster.Sanitize(kubeconfig("https://b.example", "", oidc), 0, nil); err != nil {
		t.Fatalf("oidc (allowed by Istio): %v", err)
	}
}

// TestSanitizeRefuses: what Istio refuses (plugins, the user's files), the
// CA file, and inputs that are not kubeconfigs; each option is accepted
// once allowed. No error quotes the token.
func TestSanitizeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, clusterExtra, user, option string
	}{
		{"exec", "", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'cat /var/run/secrets/*']}", cluster.OptionExec},
		{"gcp auth provider", "", "    auth-provider: {name: gcp}", "gcp"},
		{"tokenFile", "", "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token", cluster.OptionTokenFile},
		{"client-certificate", "", "    client-certificate: /etc/pki/cert.pem\n    client-key-data: eA==", cluster.OptionClientCertificate},
		{"client-key", "", "    client-certificate-data: eA==\n    client-key: /etc/pki/key.pem", cluster.OptionClientKey},
		{"certificate-authority", "    certificate-authority: /etc/ssl/ca.pem", "    token: " + secretToken, cluster.OptionCertificateAuthority},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := kubeconfig("https://b.example", tc.clusterExtra, tc.user)
			if tc.name == "certificate-authority" {
				data = []byte(strings.Replace(string(data), "    insecure-skip-tls-verify: true\n", "", 1))
			}
			_, err := cluster.Sanitize(data, 0, nil)
			if err == nil || !strings.Contains(err.Error(), "not allowed") {
				t.Fatalf("err = %v, want not allowed", err)
			}
			if strings.Contains(err.Error(), secretToken) {
				t.Fatalf("error quotes the token: %v", err)
			}
			if _, err := cluster.Sanitize(data, 0, []string{tc.option}); err != nil && strings.Contains(err.Error(), "not allowed") {
				t.Fatalf("allowed %s still refused: %v", tc.option, err)
			}
		})
	}
}

func TestSanitizeBadInput(t *testing.T) {
	huge := kubeconfig("https://b.example", "", "    token: "+strings.Repeat("x", cluster.DefaultMaxKubeconfigSize))
	for name, data := range map[string][]byte{
		"empty":           nil,
		"huge":            huge,
		"not YAML":        []byte("token: " + secretToken + "\n\t: : ["),
		"JSON not config": []byte(`{"clusters": "` + secretToken + `"}`),
		"binary":          {0xff, 0xfe, 0x00, 0x01},
		"no context":      []byte("apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: " + secretToken + "}}]\n"),
		"no server":       kubeconfig("", "", "    token: "+secretToken),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := cluster.Sanitize(data, 0, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), secretToken) {
				t.Fatalf("error quotes the input: %v", err)
			}
		})
	}
	if _, err := cluster.Sanitize(kubeconfig("https://b.example", "", "    token: x"), 100, nil); err == nil {
		t.Fatal("a kubeconfig above a 100-byte limit accepted")
	}
}

func TestCheckID(t *testing.T) {
	for _, ok := range []string{"Kubernetes", "cluster-1", "east.eu_1", strings.Repeat("a", cluster.MaxIDLength)} {
		if err := cluster.CheckID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("a", cluster.MaxIDLength+1), "a b", "a/b", "é", "a\x00", "a\nb", "${x}", "\xff"} {
		err := cluster.CheckID(bad)
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if len(err.Error()) > 200 {
			t.Errorf("%d-byte error for %d-byte input", len(err.Error()), len(bad))
		}
	}
}

func TestParseKubeconfigs(t *testing.T) {
	if got, err := cluster.ParseKubeconfigs(nil); err != nil || got != nil {
		t.Fatalf("none: %v %v", got, err)
	}
	got, err := cluster.ParseKubeconfigs([]string{"west=/etc/west.kubeconfig", "north=/a=b"})
	if err != nil || len(got) != 2 || got["west"] != "/etc/west.kubeconfig" || got["north"] != "/a=b" {
		t.Fatalf("got %v %v", got, err)
	}
	for _, bad := range [][]string{{"west"}, {"=/path"}, {"west="}, {"w=/a", "w=/b"}, {strings.Repeat("x", 1<<20)}} {
		_, err := cluster.ParseKubeconfigs(bad)
		if err == nil || len(err.Error()) > 200 {
			t.Errorf("%.40v: error %.300v", bad, err)
		}
	}
}
