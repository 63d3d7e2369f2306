// Package cputime reads the CPU time (user plus system) a process has used,
// so that benchmarks can report CPU per operation: on a shared machine
// wall-clock throughput depends on how much of the CPUs other load leaves,
// while CPU per operation does not.
package cputime
