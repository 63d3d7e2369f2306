package cputime_test

import (
	"crypto/sha256"
	"os"
	"testing"
	"time"

	"github.com/meshid/meshid/bench/cputime"
)

func TestSelfGrowsWithWork(t *testing.T) {
	before, err := cputime.Self()
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until the clock-tick counter moves (at least 10ms of work).
	buf := make([]byte, 1<<16)
	var after time.Duration
	for i := 0; after <= before; i++ {
		for range 64 {
			sum := sha256.Sum256(buf)
			buf[i%len(buf)] = sum[0]
		}
		if after, err = cputime.Of(os.Getpid())(); err != nil {
			t.Fatal(err)
		}
	}
	if after-before > time.Minute {
		t.Fatalf("CPU time jumped from %v to %v", before, after)
	}
}

func TestProcessErrors(t *testing.T) {
	if _, err := cputime.Process(-1); err == nil {
		t.Fatal("no error for pid -1")
	}
}

func TestRusageGrowsWithWork(t *testing.T) {
	before := cputime.Rusage()
	sum := sha256.Sum256(nil)
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
		sum = sha256.Sum256(sum[:])
	}
	if after := cputime.Rusage(); after <= before {
		t.Fatalf("Rusage went from %v to %v over 50ms of hashing", before, after)
	}
}
