package node

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"time"
)

// File is one file of an image's only layer.
type File struct {
	// Data is the content; Source, when set, is a host file copied instead.
	Data   []byte
	Source string
	Mode   int64 // permission bits (and setuid etc.); 0 means 0o644
	UID    int
	GID    int
	Dir    bool // a directory (Data and Source unused)
}

// Image is a container image of one layer, written without a registry or
// Docker: what `docker save` writes, which `ctr images import` reads.
type Image struct {
	// Ref is the image's name, as a pod's image field gives it
	// ("meshid:latest" is docker.io/library/meshid:latest).
	Ref        string
	Files      map[string]File // absolute paths in the image
	Entrypoint []string
	User       string // "65532:65532"; empty is root
	WorkingDir string
}

// WriteTar writes img in docker-save layout to path: manifest.json naming
// the config and the layer, the config (whose rootfs.diff_ids is the
// layer's sha256), and the layer tar.
func (img Image) WriteTar(path string) error {
	layer, err := img.layer()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(layer)
	diffID := "sha256:" + hex.EncodeToString(sum[:])
	cfg := map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"User":       img.User,
			"WorkingDir": img.WorkingDir,
			"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("node: image config: %w", err)
	}
	cfgSum := sha256.Sum256(cfgJSON)
	cfgName := hex.EncodeToString(cfgSum[:]) + ".json"
	layerName := hex.EncodeToString(sum[:]) + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   cfgName,
		"RepoTags": []string{img.Ref},
		"Layers":   []string{layerName},
	}})
	if err != nil {
		return fmt.Errorf("node: image manifest: %w", err)
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, e := range []struct {
		name string
		data []byte
	}{{cfgName, cfgJSON}, {layerName, layer}, {"manifest.json", manifest}} {
		if err := writeTarFile(tw, e.name, e.data, 0o644, 0, 0); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("node: image tar: %w", err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// layer is the image's file system as one tar, parents before children.
func (img Image) layer() ([]byte, error) {
	files := map[string]File{}
	for p, f := range img.Files {
		p = path.Clean("/" + p)
		files[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := files[d]; !ok {
				files[d] = File{Dir: true, Mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, p := range names {
		f := files[p]
		name := p[1:]
		mode := f.Mode
		if f.Dir {
			if mode == 0 {
				mode = 0o755
			}
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: f.UID, Gid: f.GID, ModTime: time.Unix(0, 0)}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, fmt.Errorf("node: layer: %w", err)
			}
			continue
		}
		data := f.Data
		if f.Source != "" {
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("node: layer: %w", err)
			}
			data = b
		}
		if mode == 0 {
			mode = 0o644
		}
		if err := writeTarFile(tw, name, data, mode, f.UID, f.GID); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("node: layer: %w", err)
	}
	return out.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, name string, data []byte, mode int64, uid, gid int) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), Uid: uid, Gid: gid, ModTime: time.Unix(0, 0)}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("node: tar %s: %w", name, err)
	}
	if _, err := io.Copy(tw, bytes.NewReader(data)); err != nil {
		return fmt.Errorf("node: tar %s: %w", name, err)
	}
	return nil
}

// ImportImage writes img as a tarball in the node's directory and imports
// it into the node's containerd (namespace k8s.io, the CRI's), so that pods
// with imagePullPolicy Never or IfNotPresent run it.
func (n *Node) ImportImage(img Image) error {
	tarPath := filepath.Join(n.dir, "images", fmt.Sprintf("%x.tar", sha256.Sum256([]byte(img.Ref))))
	if err := os.MkdirAll(filepath.Dir(tarPath), 0o700); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := img.WriteTar(tarPath); err != nil {
		return err
	}
	defer os.Remove(tarPath)
	out, err := exec.Command("ctr", "-a", n.containerdSocket(), "-n", "k8s.io", "images", "import", tarPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("node: ctr images import %s: %w\n%s", img.Ref, err, out)
	}
	return nil
}

// BuildStatic builds the main package pkg of the test/kube module (a path
// such as ./node/pause) as a static binary (CGO_ENABLED=0) into dir and
// returns its path.
func BuildStatic(moduleRoot, pkg, dir string) (string, error) {
	out := filepath.Join(dir, path.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("node: go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}
