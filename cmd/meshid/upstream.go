package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/upstream"
)

// upstreamFlags are the upstream-CA flags of `meshid server` (docs/upstream.md).
type upstreamFlags struct {
	url         string
	credentials string
	lifetime    time.Duration
	renewAt     float64
}

func (f *upstreamFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.url, "upstream", "", "the organisation's CA that mints and renews this CA's intermediate: cfssl+https://HOST:PORT?profile=NAME&ca=PATH or step+https://HOST:PORT?provisioner=NAME&ca=PATH (docs/upstream.md); excludes --ca-dir; with --ca-key each intermediate's key is created in that module (not with --kube-ca-secret); with --kube-ca-secret the elected replica mints and keeps the intermediate in the Secret meshid-ca-upstream that every replica signs with")
	fs.StringVar(&f.credentials, "upstream-credentials", "", "file with the upstream's credentials (cfssl: the profile's auth key in hex; step-ca: the JWK provisioner's private key as a plain JSON Web Key), mode 0600, 0400 or 0440 (a Secret volume)")
	fs.DurationVar(&f.lifetime, "upstream-lifetime", upstream.DefaultLifetime, "intermediate lifetime asked of the upstream (cfssl: its profile's expiry decides; step-ca: at most the provisioner's maxTLSCertDuration); an answer valid for less than the renewal period is refused")
	fs.Float64Var(&f.renewAt, "upstream-renew-at", upstream.DefaultRenewAt, "fraction of the intermediate's life at which it is renewed, in (0,1)")
}

// apply sets cfg.Upstream.
func (f *upstreamFlags) apply(cfg *caserver.Config) error {
	if f.url == "" {
		if f.credentials != "" {
			return errors.New("--upstream-credentials needs --upstream")
		}
		return nil
	}
	u, err := upstream.ParseURL(f.url)
	if err != nil {
		return fmt.Errorf("--upstream: %w", err)
	}
	cfg.Upstream = caserver.UpstreamConfig{URL: u, CredentialsFile: f.credentials, Lifetime: f.lifetime, RenewAt: f.renewAt}
	return nil
}
