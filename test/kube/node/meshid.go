package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/meshid/meshid/test/kube/harness"
)

// MeshidImages builds meshid's two images the way `make image` lays them
// out (deploy/image/Dockerfile), without Docker: the static binaries
// (CGO_ENABLED=0, -trimpath, -s -w, as `make image-context` builds them)
// with passwd, group and nsswitch.conf from deploy/image, the host's CA
// bundle, a /tmp (1777) and the nonroot home, run as 65532. ref prefixes
// the names: prefix+"meshid:"+tag and prefix+"meshid-agent:"+tag.
func MeshidImages(dir, prefix, tag string) (ca, agent Image, err error) {
	repo, err := harness.RepoRoot()
	if err != nil {
		return Image{}, Image{}, err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", dir+"/", "./cmd/meshid", "./cmd/meshid-agent")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Image{}, Image{}, fmt.Errorf("node: building meshid's static binaries: %w\n%s", err, out)
	}
	base := map[string]File{
		"/etc/passwd":                        {Source: filepath.Join(repo, "deploy/image/passwd")},
		"/etc/group":                         {Source: filepath.Join(repo, "deploy/image/group")},
		"/etc/nsswitch.conf":                 {Source: filepath.Join(repo, "deploy/image/nsswitch.conf")},
		"/etc/ssl/certs/ca-certificates.crt": {Source: "/etc/ssl/certs/ca-certificates.crt"},
		"/tmp":                               {Dir: true, Mode: 0o1777},
		"/home/nonroot":                      {Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
	}
	image := func(name string) Image {
		files := map[string]File{"/" + name: {Source: filepath.Join(dir, name), Mode: 0o755}}
		for p, f := range base {
			files[p] = f
		}
		return Image{
			Ref:        prefix + name + ":" + tag,
			Files:      files,
			Entrypoint: []string{"/" + name},
			User:       "65532:65532",
			WorkingDir: "/home/nonroot",
		}
	}
	return image("meshid"), image("meshid-agent"), nil
}
