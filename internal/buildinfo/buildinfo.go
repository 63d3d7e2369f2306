package buildinfo

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Release is the semantic version of this source tree, kept in the code
// (git tags may not travel with the repository): CHANGELOG.md has a
// section for each, naming its commit, and docs/upgrading.md says which
// releases of the CA and the agent work together. Raise it when a release
// is cut.
const Release = "0.1.0"

// Set at link time (Makefile: -ldflags "-X github.com/meshid/meshid/internal/buildinfo.version=...").
// Empty values fall back to the module's build information.
var (
	version string
	commit  string
	date    string
)

// Info is what a binary knows of its own build.
type Info struct {
	Version   string // Release, with the module or -ldflags version as build metadata when it differs (0.1.0+863033d-dirty)
	Commit    string // VCS revision; "unknown" when not built from git
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string // runtime.Version()
	Date      string // VCS commit time or -ldflags build date; "unknown" when neither
}

// Get returns the running binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(bi, version, commit, date)
}

// resolve merges the -ldflags overrides over bi (which may be nil).
func resolve(bi *debug.BuildInfo, version, commit, date string) Info {
	in := Info{GoVersion: runtime.Version()}
	if bi != nil {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			in.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Commit = s.Value
			case "vcs.time":
				in.Date = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		in.Version = version
	}
	if commit != "" {
		in.Commit = commit
	}
	if date != "" {
		in.Date = date
	}
	in.Version = semver(in.Version)
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	if in.Date == "" {
		in.Date = "unknown"
	}
	return in
}

// semver is Release, with build (a module or git describe version) as
// semver build metadata when it says more than Release.
func semver(build string) string {
	build = strings.TrimPrefix(build, "v")
	if build == "" || build == Release {
		return Release
	}
	meta := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, build)
	return Release + "+" + meta
}

// String is the one-line form printed by `version` and `--version`.
func (in Info) String() string {
	c := in.Commit
	if in.Modified {
		c += "-dirty"
	}
	return fmt.Sprintf("%s (commit %s, %s, built %s)", in.Version, c, in.GoVersion, in.Date)
}

// Register adds the meshid_build_info gauge (always 1) to reg. Registering
// it twice on one registry is not an error: two components of one process
// (meshid dev) share a registry.
func Register(reg prometheus.Registerer) error {
	in := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "meshid_build_info",
		Help:        "Build of the running binary; always 1.",
		ConstLabels: prometheus.Labels{"version": in.Version, "commit": in.Commit, "goversion": in.GoVersion},
	})
	g.Set(1)
	err := reg.Register(g)
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		return nil
	}
	return err
}
