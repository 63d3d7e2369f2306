package sdsfetch

import (
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/meshid/meshid/sds/envoysecret"
)

// parseSecret turns an SDS Secret into typed values with the decoder of
// the wire format (package envoysecret, which the SDS server encodes
// with). Errors name the field and never include key material.
func parseSecret(sec *tlsv3.Secret) (*Secret, error) {
	d, err := envoysecret.Parse(sec)
	if err != nil {
		return nil, err
	}
	return &Secret{Name: d.Name, Kind: d.Kind, Chain: d.Chain, Key: d.Key, Roots: d.Roots}, nil
}
