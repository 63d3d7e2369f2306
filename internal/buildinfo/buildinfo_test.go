package buildinfo

import (
	"os"
	"regexp"
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
	if in.Version != Release || in.Commit != "abc123" || in.Date != "2026-12-03T09:00:00Z" || !in.Modified {
		t.Fatalf("resolve = %+v", in)
	}
	if s := in.String(); !strings.Contains(s, "abc123-dirty") || !strings.Contains(s, runtime.Version()) {
		t.Fatalf("String = %q", s)
	}
}

func TestResolveLdflagsOverride(t *testing.T) {
	bi := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}
	in := resolve(bi, "v1.2.3", "def", "2026-01-01")
	if in.Version != Release+"+1.2.3" || in.Commit != "def" || in.Date != "2026-01-01" {
		t.Fatalf("resolve = %+v", in)
	}
	if in := resolve(nil, "", "", ""); in.Commit != "unknown" || in.Date != "unknown" || in.Version != Release {
		t.Fatalf("resolve(nil) = %+v", in)
	}
}

// The version is the semver kept in the code, a build's own version
// (git describe, a module pseudo-version) only its build metadata.
func TestVersionIsSemver(t *testing.T) {
	valid := regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)
	for build, want := range map[string]string{
		"": Release, "v" + Release: Release, "863033d-dirty": Release + "+863033d-dirty",
		"v0.0.0-20261204190000-863033d12345": Release + "+0.0.0-20261204190000-863033d12345",
		"a b/c":                              Release + "+a-b-c",
	} {
		got := resolve(nil, build, "", "").Version
		if got != want || !valid.MatchString(got) {
			t.Errorf("version from %q = %q, want %q (valid semver)", build, got, want)
		}
	}
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(changelog), "\n## "+Release+" ") {
		t.Fatalf("CHANGELOG.md has no section for %s", Release)
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
