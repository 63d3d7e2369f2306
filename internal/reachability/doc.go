// Package reachability tells whether a dependency answers, for a readiness
// probe that must not flap: a Tracker probes the dependency every Interval
// and reports it unavailable only once it has not answered for Grace (and,
// at start, until its first answer). The CA (ca/caserver) tracks the
// Kubernetes API server with it, so that a replica that cannot
// authenticate callers leaves its Service.
package reachability
