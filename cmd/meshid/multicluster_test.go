package main

import (
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/cluster"
)

// TestServerMultiClusterFlags: the multi-cluster flags reach the Config
// through the real command, and bad values are refused.
func TestServerMultiClusterFlags(t *testing.T) {
	clearServerEnv(t)
	if got := serverConfigOf(t); got.Clusters.ID != cluster.DefaultLocalID || got.Clusters.RemoteKubeconfigs != nil || got.Clusters.RemoteSecrets || got.Authn.TrustDomainAliases != nil {
		t.Fatalf("defaults: cluster %q remotes %v secrets %v aliases %v", got.Clusters.ID, got.Clusters.RemoteKubeconfigs, got.Clusters.RemoteSecrets, got.Authn.TrustDomainAliases)
	}
	got := serverConfigOf(t, "--cluster-id", "east",
		"--remote-kubeconfig", "west=/etc/west.kubeconfig", "--remote-kubeconfig", "north=/a=b",
		"--remote-secrets", "--insecure-kubeconfig-options", "exec,tokenFile",
		"--trust-domain-aliases", "old.example,older.example")
	if got.Clusters.ID != "east" || len(got.Clusters.RemoteKubeconfigs) != 2 || got.Clusters.RemoteKubeconfigs["west"] != "/etc/west.kubeconfig" || got.Clusters.RemoteKubeconfigs["north"] != "/a=b" {
		t.Fatalf("cluster %q remotes %v", got.Clusters.ID, got.Clusters.RemoteKubeconfigs)
	}
	if !got.Clusters.RemoteSecrets || strings.Join(got.Clusters.InsecureKubeconfigOptions, ",") != "exec,tokenFile" {
		t.Fatalf("secrets %v options %v", got.Clusters.RemoteSecrets, got.Clusters.InsecureKubeconfigOptions)
	}
	if len(got.Authn.TrustDomainAliases) != 2 || got.Authn.TrustDomainAliases[1].Name() != "older.example" {
		t.Fatalf("aliases %v", got.Authn.TrustDomainAliases)
	}
	for _, bad := range [][]string{
		{"--remote-kubeconfig", "west"},
		{"--remote-kubeconfig", "=/path"},
		{"--remote-kubeconfig", "west="},
		{"--remote-kubeconfig", "w=/a", "--remote-kubeconfig", "w=/b"},
		{"--trust-domain-aliases", "Not A Domain"},
	} {
		if _, _, err := configsOf(t, append([]string{"server"}, bad...)...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
