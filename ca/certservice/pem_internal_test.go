package certservice

import (
	"crypto/rand"
	"encoding/pem"
	"runtime"
	"testing"
)

func TestCertificatePEM(t *testing.T) {
	for _, n := range []int{0, 1, 47, 48, 49, 95, 96, 97, 500, 1234} {
		der := make([]byte, n)
		rand.Read(der)
		want := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		if got := certificatePEM(der); got != want {
			t.Fatalf("%d bytes:\n%s\nwant\n%s", n, got, want)
		}
	}
}

// TestCertificatePEMAllocatesOnce proves why certificatePEM is hand-written:
// it sizes its buffer exactly, so each call makes one allocation of the
// output's size (a buffer too small grows and copies; one too large wastes
// memory on every request).
func TestCertificatePEMAllocatesOnce(t *testing.T) {
	// 715 and 1093 bytes of DER make a PEM one byte over an allocator size
	// class (1024, 1536): there a buffer a byte or two short must grow,
	// elsewhere the size class's slack hides it.
	for _, n := range []int{1, 48, 49, 700, 715, 1093, 1234, 4000} {
		der := make([]byte, n)
		rand.Read(der)
		out := certificatePEM(der)
		if a := testing.AllocsPerRun(100, func() { _ = certificatePEM(der) }); a != 1 {
			t.Errorf("%d bytes: %v allocations a call, want 1", n, a)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const runs = 100
		for range runs {
			_ = certificatePEM(der)
		}
		runtime.ReadMemStats(&after)
		// The allocator rounds a size up to its size class (at most 1/8
		// more above 1 KiB); twice the output is far above that and far
		// below a buffer sized wrongly by a factor.
		if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 2*uint64(len(out))+64 {
			t.Errorf("%d bytes: %d bytes allocated a call for a %d-byte PEM", n, per, len(out))
		}
	}
}

func BenchmarkCertificatePEM(b *testing.B) {
	der := make([]byte, 600)
	rand.Read(der)
	b.Run("pem.EncodeToMemory", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		}
	})
	b.Run("certificatePEM", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = certificatePEM(der)
		}
	})
}
