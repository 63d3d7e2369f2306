package main

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/spiffefed"
)

// federationFlags are the SPIFFE federation flags of `meshid server`.
type federationFlags struct {
	listen       string
	profile      string
	certFile     string
	keyFile      string
	refreshHint  time.Duration
	federateWith []string
}

func (f *federationFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.listen, "bundle-endpoint-listen", "", "address of the SPIFFE bundle endpoint serving this trust domain's bundle to federated trust domains (empty = off; docs/federation.md)")
	fs.StringVar(&f.profile, "bundle-endpoint-profile", string(spiffefed.DefaultProfile), "https_spiffe (an X509-SVID of spiffe://<trust-domain>"+spiffefed.EndpointIDPath+" issued by this CA) | https_web (--bundle-endpoint-cert and --bundle-endpoint-key)")
	fs.StringVar(&f.certFile, "bundle-endpoint-cert", "", "https_web: PEM certificate chain of the bundle endpoint, read again when it changes")
	fs.StringVar(&f.keyFile, "bundle-endpoint-key", "", "https_web: PEM private key of the bundle endpoint, read again when it changes")
	fs.DurationVar(&f.refreshHint, "bundle-endpoint-refresh-hint", spiffefed.DefaultRefreshHint, "spiffe_refresh_hint of the served bundle (at least 1s; new roots are served 10m, --rotation-propagation, before they sign)")
	fs.StringArrayVar(&f.federateWith, "federate-with", nil, "TD=URL[,profile=https_spiffe|https_web][,endpoint-id=SPIFFE_ID][,bundle=PATH][,ca-file=PATH]: a trust domain whose bundle is fetched and handed to the agents (repeatable; docs/federation.md)")
}

// apply sets the federation fields of cfg (after its TrustDomain).
func (f *federationFlags) apply(cfg *caserver.Config) error {
	cfg.Federation.BundleEndpoint = spiffefed.EndpointConfig{
		Listen: f.listen, Profile: spiffefed.Profile(f.profile), CertFile: f.certFile, KeyFile: f.keyFile, RefreshHint: f.refreshHint,
	}
	if f.listen != "" {
		if _, err := spiffefed.ParseProfile(f.profile); err != nil {
			return fmt.Errorf("--bundle-endpoint-profile: %w", err)
		}
	}
	var err error
	if cfg.Federation.Peers, err = spiffefed.ParsePeers(f.federateWith, cfg.TrustDomain); err != nil {
		return fmt.Errorf("--federate-with: %w", err)
	}
	return nil
}
