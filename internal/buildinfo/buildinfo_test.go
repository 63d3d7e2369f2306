package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestResolveFromVCS(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"},
		{Key: "vcs.time", Value: "2026-12-03T09:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	in := resolve(bi, "", "", "")
	if in.Version != "devel" || in.Commit != "abc123" || in.Date != "2026-12-03T09:00:00Z" || !in.Modified {
		t.Fatalf("resolve = %+v", in)
	}
	if s := in.String(); !strings.Contains(s, "abc123-dirty") || !strings.Contains(s, runtime.Version()) {
		t.Fatalf("String = %q", s)
	}
}

func TestResolveLdflagsOverride(t *testing.T) {
	bi := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}
	in := resolve(bi, "v1.2.3", "def", "2026-01-01")
	if in.Version != "v1.2.3" || in.Commit != "def" || in.Date != "2026-01-01" {
		t.Fatalf("resolve = %+v", in)
	}
	if in := resolve(nil, "", "", ""); in.Commit != "unknown" || in.Date != "unknown" || in.Version != "devel" {
		t.Fatalf("resolve(nil) = %+v", in)
	}
}

func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if err := Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	in := Get()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "meshid_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v", mfs)
	}
	m := mfs[0].GetMetric()[0]
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || got["version"] != in.Version || got["commit"] != in.Commit || got["goversion"] != in.GoVersion {
		t.Fatalf("meshid_build_info = %v", m)
	}
}
