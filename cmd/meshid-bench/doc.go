// Command meshid-bench loads a running CA (`meshid-bench ca`) or agent
// (`meshid-bench sds`) and reports throughput, latency and memory
// (docs/benchmarks.md). It is a separate binary so that the production
// binaries, meshid and meshid-agent, do not link the load tools and the
// charts (gonum/plot).
package main
