// Package cfssl is the upstream.Authority of a cfssl CA (`cfssl serve`):
// cfssl+https://HOST:PORT?profile=NAME&ca=PATH, the intermediate signed by
// cfssl's authenticated sign endpoint (authsign) with a CA profile
// (ca_constraint), through cfssl's own api/client and auth packages.
package cfssl
