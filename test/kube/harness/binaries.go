package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// ModuleRoot is the directory of the test/kube module.
func ModuleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if ok {
		root := filepath.Dir(filepath.Dir(file))
		if _, err := os.Stat(filepath.Join(root, "hack", "build-binaries.sh")); err == nil {
			return root, nil
		}
	}
	// Built with -trimpath: walk up from the working directory.
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "build-binaries.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("harness: cannot find the test/kube module root")
		}
		dir = parent
	}
}

// RepoRoot is the meshid repository root (two levels above test/kube).
func RepoRoot() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Dir(filepath.Dir(root)), nil
}

// BinDir is where hack/build-binaries.sh puts etcd and kube-apiserver:
// $KUBE_BIN_DIR, else a per-user cache ($XDG_CACHE_HOME or ~/.cache, under
// meshid/kube-bin), shared by every clone and worktree on the machine so
// that a fresh clone (CI) does not build them again; the script's stamp of
// its inputs decides when they are rebuilt.
func BinDir() (string, error) {
	if d := os.Getenv("KUBE_BIN_DIR"); d != "" {
		return d, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("harness: no cache directory for the kube binaries (set KUBE_BIN_DIR): %w", err)
	}
	return filepath.Join(cache, "meshid", "kube-bin"), nil
}

// EnsureBinaries runs hack/build-binaries.sh, which returns at once when
// the binaries are up to date and otherwise builds them (slow only the
// first time). Concurrent callers are serialised by the script's lock.
func EnsureBinaries() (string, error) {
	return runBuildScript("build-binaries.sh")
}

// runBuildScript runs hack/<script> with KUBE_BIN_DIR set to BinDir, and
// returns BinDir.
func runBuildScript(script string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	bin, err := BinDir()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack", script))
	cmd.Env = append(os.Environ(), "KUBE_BIN_DIR="+bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("harness: %s: %w\n%s", script, err, out)
	}
	return bin, nil
}

// BuildMeshid builds the meshid command from the repository root (the
// main module, with its own go.mod and versions, exactly as a user builds
// it) into dir and returns the binary's path.
func BuildMeshid(dir string) (string, error) {
	repo, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "meshid")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/meshid")
	cmd.Dir = repo
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: go build ./cmd/meshid: %w\n%s", err, b)
	}
	return out, nil
}

var (
	meshidOnce sync.Once
	meshidPath string
	meshidErr  error
)

// BuildMeshidOnce is BuildMeshid into dir the first time it is called in
// the process; later calls return that binary (or that error), whatever
// their dir. A suite's tests that never run meshid do not build it.
func BuildMeshidOnce(dir string) (string, error) {
	meshidOnce.Do(func() {
		if meshidErr = os.MkdirAll(dir, 0o755); meshidErr == nil {
			meshidPath, meshidErr = BuildMeshid(dir)
		}
	})
	return meshidPath, meshidErr
}

// EnsureHelm runs hack/build-helm.sh, which builds the pinned Helm CLI
// (test/kube/tools/helm) into BinDir once and returns at once when its
// stamp matches, and returns the helm binary's path.
func EnsureHelm() (string, error) {
	bin, err := runBuildScript("build-helm.sh")
	if err != nil {
		return "", err
	}
	return filepath.Join(bin, "helm"), nil
}
