//go:build image

package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// nonroot is distroless's nonroot user and group, which the images run as.
const nonroot = 65532

// entry is what a test expects of one path in an image.
type entry struct {
	dir  bool
	mode int64 // permission bits with setuid, setgid and sticky
	uid  int
}

// wantFS is every path of an image whose binary is bin: what
// distroless/static:nonroot gives, and nothing else (no shell, no package
// manager, no libc).
func wantFS(bin string) map[string]entry {
	return map[string]entry{
		"etc/":                              {dir: true, mode: 0o755},
		"etc/group":                         {mode: 0o644},
		"etc/nsswitch.conf":                 {mode: 0o644},
		"etc/passwd":                        {mode: 0o644},
		"etc/ssl/":                          {dir: true, mode: 0o755},
		"etc/ssl/certs/":                    {dir: true, mode: 0o755},
		"etc/ssl/certs/ca-certificates.crt": {mode: 0o644},
		"home/":                             {dir: true, mode: 0o755},
		"home/nonroot/":                     {dir: true, mode: 0o700, uid: nonroot},
		"tmp/":                              {dir: true, mode: 0o1777},
		bin:                                 {mode: 0o755},
	}
}

// TestImages checks the images `make test-image` built, through the real
// Docker engine. The subtests share the images and run in order: one
// `meshid dev` container is enough load on a shared machine.
func TestImages(t *testing.T) {
	im := needImages(t)
	for _, c := range []struct{ image, bin string }{{im.meshid, "meshid"}, {im.agent, "meshid-agent"}} {
		t.Run("contents/"+c.bin, func(t *testing.T) { testContents(t, im, c.image, c.bin) })
		t.Run("config/"+c.bin, func(t *testing.T) { testConfig(t, c.image, c.bin) })
	}
	t.Run("runs hardened", func(t *testing.T) { testRunsHardened(t, im) })
	t.Run("filesystem", func(t *testing.T) { testFilesystem(t, im) })
	t.Run("pkcs11 needs cgo", func(t *testing.T) { testPKCS11Refused(t, im) })
	t.Run("dev in a container", func(t *testing.T) { testDev(t, im) })
	t.Run("sizes", func(t *testing.T) { testSizes(t, im) })
}

// testContents reads the image as `docker save` exports it and compares
// every path, mode and owner with wantFS; the binary is the static build
// make staged, and the CA certificates are the build host's.
func testContents(t *testing.T, im images, image, bin string) {
	files := imageFiles(t, image)
	want := wantFS(bin)
	var got []string
	for p := range files {
		got = append(got, p)
	}
	slices.Sort(got)
	for p, w := range want {
		f, ok := files[p]
		if !ok {
			t.Errorf("%s: no %s; the image holds %v", image, p, got)
			continue
		}
		h := f.hdr
		if isDir := h.Typeflag == tar.TypeDir; isDir != w.dir {
			t.Errorf("%s: %s is a directory: %v, want %v", image, p, isDir, w.dir)
		}
		if h.Mode&0o7777 != w.mode || h.Uid != w.uid || h.Gid != w.uid {
			t.Errorf("%s: %s mode %o owner %d:%d, want %o %d:%d", image, p, h.Mode&0o7777, h.Uid, h.Gid, w.mode, w.uid, w.uid)
		}
	}
	for _, p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: unexpected %s (only what distroless gives belongs in the image)", image, p)
		}
	}

	staged, err := os.ReadFile(filepath.Join(im.bin, bin))
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(files[bin].data) != sha256.Sum256(staged) {
		t.Errorf("%s: /%s is not the binary staged in %s", image, bin, im.bin)
	}
	checkStatic(t, filepath.Join(im.bin, bin))

	bundle := files["etc/ssl/certs/ca-certificates.crt"].data
	if hostBundle, err := os.ReadFile(filepath.Join(im.bin, "rootfs/etc/ssl/certs/ca-certificates.crt")); err != nil || !bytes.Equal(bundle, hostBundle) {
		t.Errorf("%s: the CA certificates are not the build host's bundle (%v)", image, err)
	}
	if pool := x509.NewCertPool(); !pool.AppendCertsFromPEM(bundle) {
		t.Errorf("%s: /etc/ssl/certs/ca-certificates.crt holds no PEM certificate", image)
	}
	if p := string(files["etc/passwd"].data); !strings.Contains(p, "\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") ||
		!strings.HasPrefix(p, "root:x:0:0:") {
		t.Errorf("%s: /etc/passwd:\n%s", image, p)
	}
	if g := string(files["etc/group"].data); !strings.Contains(g, "\nnonroot:x:65532:\n") {
		t.Errorf("%s: /etc/group:\n%s", image, g)
	}
}

// checkStatic fails unless the ELF binary at path is statically linked: no
// program interpreter, no shared library (a scratch image has no libc).
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a program interpreter: it is not static (CGO_ENABLED=0?)", path)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v (%v)", path, libs, err)
	}
}

// imageFile is one path of an image, with the content of regular files.
type imageFile struct {
	hdr  *tar.Header
	data []byte
}

// imageFiles returns the image's file system, its layers applied in order,
// read from `docker save` (its manifest.json names the layer tars, in both
// the classic layout and the OCI layout of newer engines).
func imageFiles(t *testing.T, image string) map[string]imageFile {
	t.Helper()
	saved := filepath.Join(t.TempDir(), "image.tar")
	docker(t, "save", "-o", saved, image)
	archive := readTar(t, saved)
	var manifest []struct{ Layers []string }
	if err := json.Unmarshal(archive["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("docker save %s: manifest.json: %v (%d images)", image, err, len(manifest))
	}
	files := map[string]imageFile{}
	for _, l := range manifest[0].Layers {
		layer, ok := archive[l]
		if !ok {
			t.Fatalf("docker save %s: no layer %s", image, l)
		}
		var r io.Reader = bytes.NewReader(layer)
		if len(layer) > 2 && layer[0] == 0x1f && layer[1] == 0x8b {
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l, err)
			}
			if strings.HasPrefix(path.Base(h.Name), ".wh.") {
				t.Errorf("layer %s removes %s: a layer should only add", l, h.Name)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = imageFile{hdr: h, data: data}
		}
	}
	return files
}

// readTar returns the regular files of a tar file by name.
func readTar(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if out[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
}

// testConfig checks the image's configuration: user 65532, the entrypoint,
// and the OCI annotations make took from git.
func testConfig(t *testing.T, image, bin string) {
	var cfg struct {
		User       string
		Entrypoint []string
		Cmd        []string
		WorkingDir string
		Labels     map[string]string
	}
	dockerJSON(t, &cfg, "image", "inspect", "--format", "{{json .Config}}", image)
	if cfg.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532", image, cfg.User)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/" + bin}) || len(cfg.Cmd) != 0 {
		t.Errorf("%s: entrypoint %q cmd %q, want [/%s] and none", image, cfg.Entrypoint, cfg.Cmd, bin)
	}
	if cfg.WorkingDir != "/home/nonroot" {
		t.Errorf("%s: working directory %q", image, cfg.WorkingDir)
	}
	l := cfg.Labels
	if l["org.opencontainers.image.title"] != bin {
		t.Errorf("%s: title %q", image, l["org.opencontainers.image.title"])
	}
	if v := l["org.opencontainers.image.version"]; v == "" || v == "unknown" {
		t.Errorf("%s: version %q", image, v)
	}
	if _, err := time.Parse(time.RFC3339, l["org.opencontainers.image.created"]); err != nil {
		t.Errorf("%s: created: %v", image, err)
	}
	rev := l["org.opencontainers.image.revision"]
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	switch {
	case err != nil:
		t.Logf("no git here (%v): revision %q not compared", err, rev)
	case rev != strings.TrimSpace(string(head)):
		t.Errorf("%s: revision %q, but HEAD is %s", image, rev, head)
	}
	t.Logf("%s: version %s, revision %s, created %s", image, l["org.opencontainers.image.version"], rev, l["org.opencontainers.image.created"])
}

// testRunsHardened runs each image's help and `meshid version` with
// --read-only --cap-drop ALL --security-opt no-new-privileges.
func testRunsHardened(t *testing.T, im images) {
	help := runOnce(t, nil, im.meshid, "--help")
	if !strings.Contains(help, "Usage:") || !strings.Contains(help, "dev ") || !strings.Contains(help, "server ") {
		t.Errorf("meshid --help:\n%s", help)
	}
	if out := runOnce(t, nil, im.meshid, "version"); !strings.HasPrefix(out, "meshid ") {
		t.Errorf("meshid version printed %q", out)
	}
	if out := runOnce(t, nil, im.agent, "--help"); !strings.Contains(out, "--ca-addr") || !strings.Contains(out, "--sds-socket") {
		t.Errorf("meshid-agent --help:\n%s", out)
	}
}

// runOnce runs image to completion with the hardened options plus opts and
// returns its output; it fails the test unless the container exits 0.
func runOnce(t *testing.T, opts []string, image string, args ...string) string {
	t.Helper()
	out, stderr, err := runOnceErr(t, opts, image, args...)
	if err != nil {
		t.Fatalf("docker run %s %s: %v\n%s%s", image, strings.Join(args, " "), err, out, stderr)
	}
	return out + stderr
}

func runOnceErr(t *testing.T, opts []string, image string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	n := uniqueName("once")
	t.Cleanup(func() { removeContainer(t, n) }) // if the CLI gave up on it
	run := append([]string{"run", "--rm", "--name", n}, hardened...)
	run = append(run, opts...)
	run = append(run, image)
	return dockerRun(t, append(run, args...)...)
}

// testFilesystem checks, by what the nonroot process can write, that the
// root filesystem is read-only under --read-only, that /tmp and the home
// directory are writable by 65532 without it, and that nothing else is.
// `meshid dev token --create-issuer --state-dir D` writes the dev issuer's key into D.
func testFilesystem(t *testing.T, im images) {
	token := func(dir string) []string {
		return []string{"dev", "token", "--create-issuer", "--state-dir", dir}
	}
	// --read-only: nothing is writable but a tmpfs.
	if _, stderr, err := runOnceErr(t, nil, im.meshid, token("/tmp/dev")...); err == nil || !strings.Contains(stderr, "read-only file system") {
		t.Errorf("/tmp of a --read-only container is writable (%v): %s", err, stderr)
	}
	if out := runOnce(t, []string{"--tmpfs", "/tmp"}, im.meshid, token("/tmp/dev")...); strings.Count(out, ".") != 2 {
		t.Errorf("meshid dev token on a /tmp tmpfs printed %q, want a JWT", out)
	}
	// A writable root filesystem: the image's /tmp (1777) and
	// /home/nonroot (65532, 0700) are writable by the nonroot user, the
	// rest is not (root-owned, and no capability overrides that).
	var writable []string
	for _, dir := range []string{"/tmp/dev", "/home/nonroot/dev", "/dev-state", "/etc/dev"} {
		n := uniqueName("fs")
		t.Cleanup(func() { removeContainer(t, n) })
		run := append([]string{"run", "--rm", "--name", n, "--cap-drop", "ALL", "--security-opt", "no-new-privileges", im.meshid}, token(dir)...)
		_, stderr, err := dockerRun(t, run...)
		switch {
		case err == nil:
			writable = append(writable, dir)
		case !strings.Contains(stderr, "permission denied"):
			t.Errorf("writing %s: %v %s, want permission denied", dir, err, stderr)
		}
	}
	if want := []string{"/tmp/dev", "/home/nonroot/dev"}; !slices.Equal(writable, want) {
		t.Errorf("writable by 65532: %v, want %v", writable, want)
	}
}

// testPKCS11Refused: the images' binaries are CGO_ENABLED=0 builds, which
// cannot load a PKCS#11 module; a pkcs11: key is refused with a message
// that says so, not a crash or a silent file key.
func testPKCS11Refused(t *testing.T, im images) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root: the work directory is chowned to 65532")
	}
	dir := sharedDir(t)
	pin := filepath.Join(dir, "pin")
	if err := os.WriteFile(pin, []byte("1234\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(pin, nonroot, nonroot); err != nil {
		t.Fatal(err)
	}
	mount := []string{"-v", dir + ":/w"}
	runOnce(t, mount, im.meshid, "certs", "root", "--out", "/w/root")
	_, stderr, err := runOnceErr(t, mount, im.meshid, "certs", "intermediate", "--root", "/w/root", "--out", "/w/int",
		"--name", "c1", "--key", "pkcs11:token=t;object=o?module-path=/nope.so&pin-source=/w/pin")
	if err == nil || !strings.Contains(stderr, "built without cgo (CGO_ENABLED=0)") {
		t.Errorf("a pkcs11: key in the image: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "int", "ca-key.pem")); err == nil {
		t.Errorf("the refused pkcs11: key left a file key behind")
	}
}

// testSizes reports each image's size as `docker image ls` shows it (the
// unpacked layers) and as a registry would store it (the layers gzipped),
// and holds them to the targets where they are met.
func testSizes(t *testing.T, im images) {
	const mb = 1e6
	for _, c := range []struct {
		image, bin string
		max        float64 // bytes, unpacked
		target     string
	}{
		// Issue 20: agent ≤ 25 MB (met).
		{im.agent, "meshid-agent", 25 * mb, "≤ 25 MB (issue 20): met"},
		// Issue 20: CA ≤ 60 MB (met since the CA's Kubernetes client links
		// three API groups, not client-go's 56: ca/kubeclient,
		// docs/benchmarks.md).
		{im.meshid, "meshid", 60 * mb, "≤ 60 MB (issue 20): met"},
	} {
		var size int64
		dockerJSON(t, &size, "image", "inspect", "--format", "{{json .Size}}", c.image)
		saved := filepath.Join(t.TempDir(), "image.tar")
		docker(t, "save", "-o", saved, c.image)
		gz := gzipSize(t, saved)
		t.Logf("SIZE %s (%s): %.1f MB unpacked (%d bytes), %.1f MB gzipped as pushed; target %s",
			c.bin, c.image, float64(size)/mb, size, float64(gz)/mb, c.target)
		if float64(size) > c.max {
			t.Errorf("%s is %.1f MB, over %.0f MB", c.image, float64(size)/mb, c.max/mb)
		}
	}
}

// gzipSize is the size of file gzipped at the default level, as registries
// store layers.
func gzipSize(t *testing.T, file string) int64 {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n countWriter
	zw := gzip.NewWriter(&n)
	if _, err := io.Copy(zw, f); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return int64(n)
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}
