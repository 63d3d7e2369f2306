package main

import (
	"fmt"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/cluster"
)

// clusterFlags are the multi-cluster flags of `meshid server`.
type clusterFlags struct {
	clusterID         string
	remoteKubeconfigs []string
	remoteSecrets     bool
	insecureOptions   []string
	tdAliases         []string
}

func (f *clusterFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.clusterID, "cluster-id", cluster.DefaultLocalID, "ID of the CA's own cluster (env CLUSTER_ID): requests whose ClusterID metadata is empty or this are reviewed locally")
	fs.StringArrayVar(&f.remoteKubeconfigs, "remote-kubeconfig", nil, "ID=PATH: a remote cluster whose proxies send ClusterID=ID, reviewed by the API server of the kubeconfig PATH (repeatable)")
	fs.BoolVar(&f.remoteSecrets, "remote-secrets", false, "watch Istio remote secrets (label istio/multiCluster=true) in --namespace for remote clusters (needs list and watch on secrets there)")
	fs.StringSliceVar(&f.insecureOptions, "insecure-kubeconfig-options", nil, "what remote secrets' kubeconfigs may use although it runs a program or reads a local file: exec, tokenFile, clientCertificate, clientKey, certificateAuthority, or an auth provider name")
	fs.StringSliceVar(&f.tdAliases, "trust-domain-aliases", nil, "other trust domains whose identities this CA accepts in client-certificate renewals")
}

// apply sets the multi-cluster fields of cfg.
func (f *clusterFlags) apply(cfg *caserver.Config) error {
	cfg.Clusters.ID = f.clusterID
	cfg.Clusters.RemoteSecrets = f.remoteSecrets
	cfg.Clusters.InsecureKubeconfigOptions = f.insecureOptions
	var err error
	if cfg.Clusters.RemoteKubeconfigs, err = cluster.ParseKubeconfigs(f.remoteKubeconfigs); err != nil {
		return fmt.Errorf("--remote-kubeconfig: %w", err)
	}
	for _, a := range f.tdAliases {
		td, err := spiffeid.TrustDomainFromString(a)
		if err != nil {
			return fmt.Errorf("--trust-domain-aliases %q: %w", a, err)
		}
		cfg.Authn.TrustDomainAliases = append(cfg.Authn.TrustDomainAliases, td)
	}
	return nil
}
