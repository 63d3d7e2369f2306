//go:build image

package image_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// guard bounds every docker command and every wait, so that a bug fails a
// test instead of hanging it.
const guard = 2 * time.Minute

// runID makes the names of this run's containers, networks and images its
// own: runs on one engine (two engineers, a retried CI job) never collide.
var runID = func() string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}()

// name is a container, network or image name of this run.
func name(what string) string { return "meshid-image-test-" + runID + "-" + what }

var seq atomic.Int64

// uniqueName is a name of this run never returned before.
func uniqueName(what string) string { return name(fmt.Sprintf("%s-%d", what, seq.Add(1))) }

// images are the images under test and the static binaries they hold.
type images struct {
	meshid, agent string // references, such as meshid-test/meshid:test-1-ab
	bin           string // directory of the same meshid and meshid-agent binaries
}

// onCI reports whether the tests run under CI, where they must not skip.
func onCI() bool { return os.Getenv("CI") == "true" }

// skipOrFail skips the test, or fails it under CI=true.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if onCI() {
		t.Fatalf(format+" (CI=true: the image tests must run; .ci/run installs and starts Docker)", args...)
	}
	t.Skipf(format, args...)
}

// needDocker skips (fails under CI) unless a Docker engine answers.
func needDocker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", "info").CombinedOutput(); err != nil {
		skipOrFail(t, "no Docker engine answers `docker info`: %v\n%s", err, lastLines(string(out), 5))
	}
}

// needImages returns the images `make test-image` built for this run, and
// removes them when the test ends if MESHID_IMAGE_REMOVE=1 says they are the
// run's own. It skips (fails under CI) when they or Docker are missing.
func needImages(t *testing.T) images {
	t.Helper()
	im := images{
		meshid: os.Getenv("MESHID_IMAGE"),
		agent:  os.Getenv("MESHID_AGENT_IMAGE"),
		bin:    os.Getenv("MESHID_IMAGE_BIN"),
	}
	if im.meshid == "" || im.agent == "" || im.bin == "" {
		skipOrFail(t, "MESHID_IMAGE, MESHID_AGENT_IMAGE and MESHID_IMAGE_BIN are not all set: run `make test-image`")
	}
	needDocker(t)
	for _, ref := range []string{im.meshid, im.agent} {
		if _, stderr, err := dockerRun(t, "image", "inspect", ref); err != nil {
			t.Fatalf("image %s: %v\n%s", ref, err, stderr)
		}
	}
	if os.Getenv("MESHID_IMAGE_REMOVE") == "1" {
		t.Cleanup(func() { removeImages(t, im.meshid, im.agent) })
	}
	return im
}

// removeImages removes image references (an image tagged elsewhere too is
// only untagged).
func removeImages(t *testing.T, refs ...string) {
	t.Helper()
	args := append([]string{"image", "rm"}, refs...)
	if _, stderr, err := dockerRun(t, args...); err != nil {
		t.Errorf("removing images %v: %v\n%s", refs, err, stderr)
	}
}

// dockerRun runs a docker command and returns its output.
func dockerRun(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return dockerIn(t, nil, args...)
}

// dockerIn is dockerRun with stdin.
func dockerIn(t *testing.T, stdin []byte, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// docker runs a docker command that must succeed and returns its stdout.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := dockerRun(t, args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

// dockerJSON runs `docker ... --format {{json X}}` and decodes the result.
func dockerJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := docker(t, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("docker %s printed %q: %v", strings.Join(args, " "), out, err)
	}
}

// removeContainer removes a container, running or not, and logs its output
// when the test failed.
func removeContainer(t *testing.T, name string) {
	t.Helper()
	if t.Failed() {
		if out, stderr, err := dockerRun(t, "logs", name); err == nil {
			t.Logf("container %s output:\n%s%s", name, lastLines(out, 40), lastLines(stderr, 40))
		}
	}
	if _, stderr, err := dockerRun(t, "rm", "-f", "-v", name); err != nil && !strings.Contains(stderr, "No such container") {
		t.Errorf("removing container %s: %v\n%s", name, err, stderr)
	}
}

// hardened are the docker run options every container of these tests runs
// with: what a restricted Kubernetes pod gets (readOnlyRootFilesystem, all
// capabilities dropped, allowPrivilegeEscalation: false).
var hardened = []string{"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"}

// startContainer runs image detached under name with the hardened options
// plus opts, passing args to its entrypoint, and removes it when the test
// ends.
func startContainer(t *testing.T, name, image string, opts []string, args ...string) {
	t.Helper()
	t.Cleanup(func() { removeContainer(t, name) })
	run := append([]string{"run", "-d", "--name", name}, hardened...)
	run = append(run, opts...)
	run = append(run, image)
	docker(t, append(run, args...)...)
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n") + "\n"
}
