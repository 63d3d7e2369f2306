package sdsserver_test

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/meshid/meshid/testkit"
)

// BenchmarkStreamFirstDefault measures the time from opening a stream to
// receiving default, over the real socket with a real Manager and the real
// CA server on loopback:
//   - cached: the Manager holds the certificate; no other stream watches it
//     (the stream watches it and fetches it from the Manager).
//   - cached-shared: another stream already subscribes to default, as when
//     a proxy reconnects to a busy agent.
//   - cold: a fresh agent; the stream waits for key generation and the
//     CreateCertificate call to the CA.
func BenchmarkStreamFirstDefault(b *testing.B) {
	b.Run("cached", func(b *testing.B) { benchFirstDefault(b, false) })
	b.Run("cached-shared", func(b *testing.B) { benchFirstDefault(b, true) })
	b.Run("cold", func(b *testing.B) {
		cas := newCAStack(b)
		lat := make([]time.Duration, 0, b.N)
		for range b.N {
			b.StopTimer()
			m, stopManager := cas.newManager(b, nil)
			h := startUntilStopped(b, m, quiet)
			b.StartTimer()
			lat = append(lat, firstDefault(b, h.client))
			b.StopTimer()
			h.stop()
			stopManager()
			b.StartTimer()
		}
		reportLatency(b, lat)
	})
}

func benchFirstDefault(b *testing.B, shared bool) {
	m := newCAStack(b).m
	if _, err := m.Secret(context.Background(), dflt); err != nil {
		b.Fatal(err)
	}
	h := start(b, m, quiet)
	if shared {
		c := newSotw(b, h.client, nil)
		c.request(dflt)
		c.recv()
		c.ack()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cpuTime()
	for range b.N {
		lat = append(lat, firstDefault(b, h.client))
	}
	cpu := cpuTime() - c0
	b.StopTimer()
	reportLatency(b, lat)
	// Client and server CPU together; unlike the latency it does not grow
	// with the machine's load.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}

// firstDefault opens a stream, asks for default and returns how long the
// answer took.
func firstDefault(b *testing.B, client secretv3.SecretDiscoveryServiceClient) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	t0 := time.Now()
	s, err := client.StreamSecrets(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Send(sotwRequest("bench", dflt)); err != nil {
		b.Fatal(err)
	}
	r, err := s.Recv()
	if err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	if len(r.GetResources()) != 1 {
		b.Fatal("no resource")
	}
	return d
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// BenchmarkRotationFanout10k holds 10,000 SotW streams on one agent (a real
// Manager and CA server behind it) and measures one forced rotation (new
// key, CreateCertificate, push) until every stream holds the new
// certificate.
//
// The clients run in a child process (this test binary, see TestMain) over
// 100 connections of 100 streams, each ACKing like Envoy, so that the
// memory figures are the agent's alone: agent-B/stream is the growth of the
// Go heap and stacks per open stream, agent-RSS-MB the process RSS with all
// streams open (this process also runs the CA), agent-RSS-before-MB before
// they were opened. cpu-ms/op is the agent's CPU time per rotation, which the
// machine's load does not inflate.
func BenchmarkRotationFanout10k(b *testing.B) {
	const streams, conns = 10000, 100
	m := newCAStack(b).m
	if _, err := m.Secret(context.Background(), dflt); err != nil {
		b.Fatal(err)
	}
	h := start(b, m, quiet)
	h.stop() // the harness's own client is not part of the load
	h = start(b, m, quiet)

	before := memNow()
	lc := startLoadClient(b, h.path, streams, conns)
	lc.wait("ready")
	after := memNow()

	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		c0 := cpuTime()
		if err := m.Rotate(context.Background()); err != nil {
			b.Fatal(err)
		}
		s, err := m.Secret(context.Background(), dflt)
		if err != nil {
			b.Fatal(err)
		}
		lc.send("expect " + s.Version)
		lc.wait("done")
		cpu += cpuTime() - c0
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(after.heap+after.stack-before.heap-before.stack)/streams, "agent-B/stream")
	b.ReportMetric(float64(after.stack-before.stack)/streams, "agent-stack-B/stream")
	b.ReportMetric(float64(after.rss)/(1<<20), "agent-RSS-MB")
	b.ReportMetric(float64(before.rss)/(1<<20), "agent-RSS-before-MB")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/streams, "goroutines/stream")
}

type memSample struct {
	heap, stack uint64 // in use
	rss         uint64
	goroutines  int
}

func memNow() memSample {
	runtime.GC()
	debug.FreeOSMemory() // RSS without what earlier runs left to the runtime
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heap: ms.HeapInuse, stack: ms.StackInuse, rss: rss(), goroutines: runtime.NumGoroutine()}
}

// rss reads the resident set size of this process from /proc.
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
