package chart_test

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// federationValues: the bundle endpoint on https_web with its certificate
// Secret, and two peers: b.example over https_spiffe (bootstrap bundle from
// a ConfigMap), c.example over https_web (extra roots from a ConfigMap).
var federationValues = []string{
	"federation.bundleEndpoint.enabled=true", "federation.bundleEndpoint.port=9443",
	"federation.bundleEndpoint.profile=https_web", "federation.bundleEndpoint.certSecret=bundle-tls",
	"federation.bundleEndpoint.refreshHint=1m", "federation.bundleEndpoint.service.type=LoadBalancer",
	"federation.federateWith[0].trustDomain=b.example", "federation.federateWith[0].url=https://bundle.b.example:8443/",
	"federation.federateWith[0].endpointID=spiffe://b.example/meshid/bundle-endpoint",
	"federation.federateWith[0].bundleConfigMap.name=b-bundle",
	"federation.federateWith[1].trustDomain=c.example", "federation.federateWith[1].url=https://c.example/bundle",
	"federation.federateWith[1].profile=https_web",
	"federation.federateWith[1].caConfigMap.name=c-roots", "federation.federateWith[1].caConfigMap.key=roots.pem",
}

// TestTemplateFederation (issue 31): the bundle endpoint gets a Service of
// its own (not the CSR API's), a container port, its https_web certificate
// mounted from the Secret, and an ingress rule; each federateWith entry
// becomes one --federate-with whose files are the mounted ConfigMaps' keys;
// every rendered flag is one `meshid server --help` lists.
func TestTemplateFederation(t *testing.T) {
	const ns = "istio-system"
	r := render(t, "meshid", ns, federationValues...)
	d := deployment(t, r, ns, "meshid")
	c := d.Spec.Template.Spec.Containers[0]
	for _, want := range []string{
		"--bundle-endpoint-listen=0.0.0.0:9443", "--bundle-endpoint-profile=https_web",
		"--bundle-endpoint-cert=/etc/meshid/bundle-endpoint/tls.crt", "--bundle-endpoint-key=/etc/meshid/bundle-endpoint/tls.key",
		"--bundle-endpoint-refresh-hint=1m",
		"--federate-with=b.example=https://bundle.b.example:8443/,endpoint-id=spiffe://b.example/meshid/bundle-endpoint,bundle=/etc/meshid/federation/0/bundle/bundle",
		"--federate-with=c.example=https://c.example/bundle,profile=https_web,ca-file=/etc/meshid/federation/1/ca/roots.pem",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args lack %q: %q", want, c.Args)
		}
	}
	help, err := exec.Command(meshidBinary(t), "server", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("meshid server --help: %v\n%s", err, help)
	}
	for _, a := range c.Args {
		if name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "="); strings.HasPrefix(name, "bundle-endpoint") || name == "federate-with" {
			if !regexp.MustCompile(`--` + name + `\b`).Match(help) {
				t.Errorf("rendered %q: not a flag of meshid server", a)
			}
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	vols := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	for name, want := range map[string]struct{ path, source string }{
		"bundle-endpoint-cert": {"/etc/meshid/bundle-endpoint", "bundle-tls"},
		"federation-0-bundle":  {"/etc/meshid/federation/0/bundle", "b-bundle"},
		"federation-1-ca":      {"/etc/meshid/federation/1/ca", "c-roots"},
	} {
		v := vols[name]
		src := ""
		if v.Secret != nil {
			src = v.Secret.SecretName
		} else if v.ConfigMap != nil {
			src = v.ConfigMap.Name
		}
		if mounts[name] != want.path || src != want.source {
			t.Errorf("volume %s: mounted at %q from %q, want %q from %q", name, mounts[name], src, want.path, want.source)
		}
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "https-bundle" && p.ContainerPort == 9443 }) {
		t.Errorf("container ports %+v lack https-bundle 9443", c.Ports)
	}

	var svc corev1.Service
	into(t, r.get(t, "Service", ns, "meshid-bundle-endpoint"), &svc)
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9443 || svc.Spec.Ports[0].TargetPort.StrVal != "https-bundle" {
		t.Errorf("bundle endpoint Service %+v", svc.Spec)
	}
	// The CSR API's Service does not carry the bundle endpoint.
	var csr corev1.Service
	into(t, r.get(t, "Service", ns, "meshid"), &csr)
	for _, p := range csr.Spec.Ports {
		if p.Name == "https-bundle" || p.Port == 9443 {
			t.Errorf("the CSR API's Service exposes the bundle endpoint: %+v", csr.Spec.Ports)
		}
	}
	var np networkingv1.NetworkPolicy
	into(t, r.get(t, "NetworkPolicy", ns, "meshid"), &np)
	if !slices.ContainsFunc(np.Spec.Ingress, func(in networkingv1.NetworkPolicyIngressRule) bool {
		return len(in.Ports) == 1 && in.Ports[0].Port.StrVal == "https-bundle" && len(in.From) == 0
	}) {
		t.Errorf("NetworkPolicy admits no one to the bundle endpoint: %+v", np.Spec.Ingress)
	}

	// Off (the default): no Service, port, flag or mount of federation.
	off := render(t, "meshid", ns)
	if o := off[key("Service", ns, "meshid-bundle-endpoint")]; o != nil {
		t.Error("bundle endpoint Service rendered while disabled")
	}
	for _, a := range deployment(t, off, ns, "meshid").Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--bundle-endpoint") || strings.HasPrefix(a, "--federate-with") {
			t.Errorf("rendered %q while federation is off", a)
		}
	}
}

// TestTemplateRefusesBadFederation: values the CA cannot federate with
// fail the render naming the value.
func TestTemplateRefusesBadFederation(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"federation.bundleEndpoint.profile=http"}, "federation.bundleEndpoint.profile"},
		{[]string{"federation.bundleEndpoint.enabled=true", "federation.bundleEndpoint.profile=https_web"}, "federation.bundleEndpoint.certSecret"},
		{[]string{"federation.federateWith[0].trustDomain=b.example"}, "trustDomain and url"},
		{[]string{"federation.federateWith[0].trustDomain=b.example", "federation.federateWith[0].url=https://b/"}, "endpointID"},
	} {
		if _, err := renderErr(t, "meshid", "istio-system", c.set...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %v: %v, want an error naming %s", c.set, err, c.want)
		}
	}
}
