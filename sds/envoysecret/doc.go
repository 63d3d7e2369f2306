// Package envoysecret is the SDS wire format in one place: the xDS type of
// Envoy's Secret resource, the names of the SPIFFE certificate validator
// and of meshid's node metadata switch, and the mapping between typed
// certificates and keys and go-control-plane's tlsv3.Secret, both ways.
// The SDS server (sds/sdsserver) encodes with it; the SDS client
// (sdsfetch, `meshid inspect --sds`) decodes with it.
//
// A certificate secret is a TlsCertificate with the inline PEM chain and
// PKCS#8 key; a root secret a CertificateValidationContext whose
// trusted_ca is the inline bundle, or, in the SPIFFE validator form, a
// custom_validator_config envoy.tls.cert_validator.spiffe holding the
// trust domain and its bundle. PEM exists only here, on the wire.
package envoysecret
