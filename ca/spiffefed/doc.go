// Package spiffefed is SPIFFE federation on the CA side
// (spiffe/spiffe standards/SPIFFE_Federation.md), in three parts:
//
//   - Endpoint serves this trust domain's bundle (x509-svid roots, the
//     union during a CA rotation, and jwt-svid keys, with
//     spiffe_refresh_hint and spiffe_sequence) at a bundle endpoint, with
//     go-spiffe's federation.NewHandler inside a TLS server of its own
//     (profile https_spiffe: an X509-SVID issued by the CA for
//     EndpointID; https_web: a certificate from files, reloaded when they
//     change), GET only, with connection, rate, header and time limits.
//   - Federator fetches and watches the bundle of every other trust
//     domain configured with --federate-with (ParsePeer), per trust
//     domain, never merged: refreshed at the bundle's refresh hint (at
//     least MinRefresh, DefaultRefresh without one), a bundle for the
//     wrong trust domain, with a lower sequence, too large or redirected
//     refused and logged, the last good bundle kept through outages and
//     persisted under the state directory.
//   - The agents receive the Federator's bundles from ca/certservice
//     (internal/federationapi), so that workloads and Envoy can trust
//     peers of the federated trust domains, each with its own roots.
//
// go-spiffe's federation.FetchBundle is not used to fetch: it follows
// redirects and reads a body of any size. The fetch here uses go-spiffe's
// tlsconfig (https_spiffe) and spiffebundle.Parse, with those limits.
package spiffefed
