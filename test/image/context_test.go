//go:build image

package image_test

import (
	"archive/tar"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// probeDockerfile copies the whole build context into an image, so that the
// image shows what the engine received.
const probeDockerfile = "FROM scratch\nCOPY . /ctx/\n"

// TestBuildContext: the repository's .dockerignore lets only bin/image/ (the
// staged binaries and root filesystem) into the images' build context: no
// key, token, socket, state directory, other build or cache, wherever it
// lies, even inside bin/image/. Checked with the real engine on a copy of
// the repository's layout with such files planted, and on the repository
// itself.
func TestBuildContext(t *testing.T) {
	needDocker(t)
	repo := repoRoot(t)
	ignore, err := os.ReadFile(filepath.Join(repo, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("planted", func(t *testing.T) {
		dir := t.TempDir()
		for _, f := range []string{
			// what the images need
			"bin/image/meshid", "bin/image/meshid-agent", "bin/image/rootfs/etc/passwd",
			"bin/image/rootfs/etc/ssl/certs/ca-certificates.crt",
			// never: keys, tokens and sockets, also inside bin/image/
			"bin/image/ca-key.pem", "bin/image/rootfs/etc/jwt-key.pem", "bin/image/root-cert.pem",
			"bin/image/tls.key", "bin/image/token", "bin/image/istio-token", "bin/image/sds.sock",
			"bin/image/.git/config",
			// never: other builds, state directories, caches, sources
			"bin/meshid", "bin/meshid-bench", "bin/ca-key.pem",
			".meshid-dev/ca-key.pem", ".meshid-dev/jwt-key.pem", ".meshid-dev/token",
			"var/lib/meshid/root-key.pem", "var/run/secrets/tokens/istio-token",
			"certs/work/root/root-key.pem", "test/kube/.cache/kube-apiserver", ".cache/go-build/x",
			".git/config", "go.mod", "cmd/meshid/main.go", "deploy/20-ca.yaml", "tls.key",
		} {
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(f), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, ".dockerignore"), ignore, 0o644); err != nil {
			t.Fatal(err)
		}
		got := contextFiles(t, dir)
		want := []string{"bin/image/meshid", "bin/image/meshid-agent", "bin/image/rootfs/etc/passwd",
			"bin/image/rootfs/etc/ssl/certs/ca-certificates.crt"}
		if !slices.Equal(got, want) {
			t.Errorf("build context holds\n  %v\nwant\n  %v", got, want)
		}
	})

	t.Run("repository", func(t *testing.T) {
		got := contextFiles(t, repo)
		for _, f := range got {
			base := filepath.Base(f)
			if !strings.HasPrefix(f, "bin/image/") || strings.Contains(base, "key") ||
				strings.Contains(base, "token") || strings.HasSuffix(base, ".pem") {
				t.Errorf("the repository's build context holds %s", f)
			}
		}
		t.Logf("the repository's build context: %v", got)
	})
}

// contextFiles builds probeDockerfile on dir as context and returns the
// regular files the image received, sorted.
func contextFiles(t *testing.T, dir string) []string {
	t.Helper()
	image := uniqueName("context") + ":probe"
	t.Cleanup(func() { removeImages(t, image) })
	if out, stderr, err := dockerIn(t, []byte(probeDockerfile), "build", "-q", "-f", "-", "-t", image, dir); err != nil {
		t.Fatalf("docker build of the context probe: %v\n%s%s", err, out, stderr)
	}
	var got []string
	for p, f := range imageFiles(t, image) {
		if f.hdr.Typeflag == tar.TypeReg {
			got = append(got, strings.TrimPrefix(p, "ctx/"))
		}
	}
	slices.Sort(got)
	return got
}

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		// No git: the package lies at test/image.
		abs, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	return strings.TrimSpace(string(out))
}
