package caserver

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestApplyGC: the default Config sets GOGC to DefaultGCPercent, a
// negative GCPercent leaves the runtime's (an operator's GOGC), and a
// MemoryLimit is set only when given.
func TestApplyGC(t *testing.T) {
	pct, lim := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(pct); debug.SetMemoryLimit(lim) })
	current := func() (int, int64) {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		return p, debug.SetMemoryLimit(-1)
	}

	cfg, err := Config{Kube: KubeConfig{PodName: "p"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	applyGC(cfg.Runtime.GCPercent, cfg.Runtime.MemoryLimit)
	if p, l := current(); p != DefaultGCPercent || l != math.MaxInt64 {
		t.Errorf("defaults: GOGC %d, limit %d; want %d, no limit", p, l, DefaultGCPercent)
	}

	debug.SetGCPercent(150)
	cfg, err = Config{Kube: KubeConfig{PodName: "p"}, Runtime: RuntimeConfig{GCPercent: -1, MemoryLimit: 1 << 30}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	applyGC(cfg.Runtime.GCPercent, cfg.Runtime.MemoryLimit)
	if p, l := current(); p != 150 || l != 1<<30 {
		t.Errorf("GCPercent -1, MemoryLimit 1 GiB: GOGC %d, limit %d; want the runtime's 150 and 1 GiB", p, l)
	}

	if _, err := (Config{Kube: KubeConfig{PodName: "p"}, Runtime: RuntimeConfig{MemoryLimit: -1}}).withDefaults(); err == nil {
		t.Error("a negative memory limit was accepted")
	}
}
