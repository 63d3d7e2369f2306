// Package latency summarises request latencies for the load tools of
// `meshid-bench`: exact nearest-rank percentiles over every recorded sample,
// and a compact human rendering of durations.
//
// A Recorder is not safe for concurrent use: give each load worker its own
// and Merge them when the run ends, so that recording costs one append and
// never a lock on the measured path.
package latency
