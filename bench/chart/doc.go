// Package chart draws the throughput-against-concurrency chart of
// `meshid-bench ca --sweep` as SVG or PNG, with gonum's plot library.
//
// The x axis is logarithmic with one tick per measured concurrency level
// (sweeps usually double the concurrency), the y axis linear from zero, and
// each point is labelled with its figure so that the picture reads without
// the table.
package chart
