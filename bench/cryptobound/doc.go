// Package cryptobound measures the in-process raw crypto bound of a CA: how
// many issuances per second the machine could sustain if an issuance cost
// nothing but its two public-key operations, one check of the CSR's
// signature and one signature by the CA's key.
//
// `meshid-bench ca --crypto-bound` measures it just before the load, on the
// same machine and the same CPUs, so that the CA's end-to-end throughput can
// be stated as a fraction of it, a ratio that holds on any machine.
package cryptobound
