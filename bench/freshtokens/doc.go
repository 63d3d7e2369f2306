// Package freshtokens prepares a restart storm on a real cluster for
// `meshid-bench ca --fresh-tokens N`: it creates N pods (spec.nodeName
// set, so no kubelet or scheduler is needed and their tokens name a
// node) of one service account, mints one pod-bound token per pod with
// the TokenRequest API, and reads the API server's own request counter
// (apiserver_request_total on /metrics) so that a run reports what it cost
// the API server, by resource.
package freshtokens
