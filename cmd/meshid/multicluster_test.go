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
	if got := serverConfigOf(t); got.ClusterID != cluster.DefaultLocalID || got.RemoteKubeconfigs != nil || got.RemoteSecrets || got.TrustDomainAliases != nil {
		t.Fatalf("defaults: cluster %q remotes %v secrets %v aliases %v", got.ClusterID, got.RemoteKubeconfigs, got.RemoteSecrets, got.TrustDomainAliases)
	}
	got := serverConfigOf(t, "--cluster-id", "east",
		"--remote-kubeconfig", "west=/etc/west.kubeconfig", "--remote-kubeconfig", "north=/a=b",
		"--remote-secrets", "--insecure-kubeconfig-options", "exec,tokenFile",
		"--trust-domain-aliases", "old.example,older.example")
	if got.ClusterID != "east" || len(got.RemoteKubeconfigs) != 2 || got.RemoteKubeconfigs["west"] != "/etc/west.kubeconfig" || got.RemoteKubeconfigs["north"] != "/a=b" {
		t.Fatalf("cluster %q remotes %v", got.ClusterID, got.RemoteKubeconfigs)
	}
	if !got.RemoteSecrets || strings.Join(got.InsecureKubeconfigOptions, ",") != "exec,tokenFile" {
		t.Fatalf("secrets %v options %v", got.RemoteSecrets, got.InsecureKubeconfigOptions)
	}
	if len(got.TrustDomainAliases) != 2 || got.TrustDomainAliases[1].Name() != "older.example" {
		t.Fatalf("aliases %v", got.TrustDomainAliases)
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
