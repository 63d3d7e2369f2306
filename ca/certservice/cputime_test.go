package certservice_test

import "github.com/meshid/meshid/bench/cputime"

// processCPU is the CPU time the test process has used; the benchmark
// reports it per certificate besides wall-clock throughput.
var processCPU = cputime.Rusage
