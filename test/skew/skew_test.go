package skew_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/sdsfetch"
	"github.com/meshid/meshid/testkit"
)

// binaries are one release's CA (meshid) and agent (meshid-agent).
type binaries struct {
	version string // what `meshid version` says
	meshid  string
	agent   string
}

var (
	root    string   // the repository's root
	current binaries // built from this tree by TestMain
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = filepath.Abs(filepath.Join("..", "..")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "meshid-skew-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	label := "tree"
	if head, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
		label = strings.TrimSpace(string(head)) + "+tree"
	}
	if current, err = build(root, dir, label); err != nil {
		fmt.Fprintln(os.Stderr, "build the current binaries:", err)
		return 1
	}
	return m.Run()
}

// build builds cmd/meshid and cmd/meshid-agent of the source tree src into
// out, with commit as the commit `meshid version` reports.
func build(src, out, commit string) (binaries, error) {
	b := binaries{meshid: filepath.Join(out, "meshid"), agent: filepath.Join(out, "meshid-agent")}
	for pkg, bin := range map[string]string{"./cmd/meshid": b.meshid, "./cmd/meshid-agent": b.agent} {
		cmd := exec.Command("go", "build", "-ldflags", "-X github.com/meshid/meshid/internal/buildinfo.commit="+commit, "-o", bin, pkg)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
		if o, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build %s in %s: %v\n%s", pkg, src, err, o)
		}
	}
	v, err := exec.Command(b.meshid, "version").Output()
	if err != nil {
		return b, fmt.Errorf("%s version: %v", b.meshid, err)
	}
	b.version = strings.TrimSpace(string(v))
	return b, nil
}

// sectionRE and commitRE read CHANGELOG.md: a release's heading, and the
// commit its section names.
var (
	sectionRE = regexp.MustCompile(`(?m)^## (\d+\.\d+\.\d+)\b`)
	commitRE  = regexp.MustCompile(`(?m)^Commit: ([0-9a-f]{7,40})\b`)
)

// previousRelease returns the newest release CHANGELOG.md names a commit
// for, and that commit.
func previousRelease(t *testing.T) (version, commit string) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	heads := sectionRE.FindAllSubmatchIndex(log, -1)
	for i, h := range heads {
		end := len(log)
		if i+1 < len(heads) {
			end = heads[i+1][0]
		}
		if c := commitRE.FindSubmatch(log[h[1]:end]); c != nil {
			return string(log[h[2]:h[3]]), string(c[1])
		}
	}
	t.Fatal("CHANGELOG.md names no release commit (a `Commit: <hash>` line in a `## X.Y.Z` section)")
	return "", ""
}

// noHistory skips, or fails under CI=true: CI must test the skew.
func noHistory(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...) + ": the skew test needs the git history (a full clone)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

var (
	previousOnce sync.Once
	previous     binaries
	previousErr  error
	previousSkip string
	previousHash string // the full hash of the previous release's commit
)

// previousBinaries returns the previous release's binaries, built once
// per commit and cached under the user's cache directory.
func previousBinaries(t *testing.T) binaries {
	t.Helper()
	version, commit := previousRelease(t)
	previousOnce.Do(func() {
		full, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
		if err != nil {
			previousSkip = fmt.Sprintf("commit %s of release %s is not in this repository (%v)", commit, version, err)
			return
		}
		previousHash = strings.TrimSpace(string(full))
		commit := previousHash
		cache, err := os.UserCacheDir()
		if err != nil {
			previousErr = err
			return
		}
		dir := filepath.Join(cache, "meshid", "skew", commit)
		previous = binaries{meshid: filepath.Join(dir, "meshid"), agent: filepath.Join(dir, "meshid-agent")}
		if !exists(previous.meshid) || !exists(previous.agent) {
			previousErr = buildAt(commit, dir)
		}
		if previousErr == nil {
			v, err := exec.Command(previous.meshid, "version").Output()
			previous.version, previousErr = strings.TrimSpace(string(v)), err
		}
	})
	if previousSkip != "" {
		noHistory(t, "%s", previousSkip)
	}
	if previousErr != nil {
		t.Fatalf("the binaries of release %s: %v", version, previousErr)
	}
	if !strings.Contains(previous.version, version) || !strings.Contains(previous.version, previousHash[:12]) {
		t.Fatalf("the binary built from release %s's commit %s says %q", version, previousHash, previous.version)
	}
	return previous
}

func exists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// buildAt builds the binaries of commit into dir: the tree from git
// archive in a temporary directory, built there, the binaries moved into
// dir (each by a rename, so a concurrent run sees none or a whole one).
func buildAt(commit, dir string) error {
	src, err := os.MkdirTemp("", "meshid-skew-src-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	tar := filepath.Join(src, "src.tar")
	if o, err := exec.Command("git", "-C", root, "archive", "-o", tar, commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %v\n%s", commit, err, o)
	}
	tree := filepath.Join(src, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}
	if o, err := exec.Command("tar", "-xf", tar, "-C", tree).CombinedOutput(); err != nil {
		return fmt.Errorf("untar %s: %v\n%s", commit, err, o)
	}
	out := filepath.Join(src, "bin")
	if _, err := build(tree, out, commit[:12]); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"meshid", "meshid-agent"} {
		if err := os.Rename(filepath.Join(out, name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// TestPreviousAgentCurrentCA: an agent of the previous release gets its
// certificate from the CA of this tree (the upgrade window: CA first).
func TestPreviousAgentCurrentCA(t *testing.T) {
	prev := previousBinaries(t)
	t.Logf("CA %s, agent %s", current.version, prev.version)
	roundTrip(t, current.meshid, prev.agent)
}

// TestCurrentAgentPreviousCA: the agent of this tree gets its certificate
// from a CA of the previous release (agents rolled back after the CA, or
// upgraded before it: docs/upgrading.md says CA first, and this direction
// is what a rollback of the CA leaves running).
func TestCurrentAgentPreviousCA(t *testing.T) {
	prev := previousBinaries(t)
	t.Logf("CA %s, agent %s", prev.version, current.version)
	roundTrip(t, prev.meshid, current.agent)
}

// serving is the CA's log line with its gRPC address.
var serving = regexp.MustCompile(`msg="meshid CA serving".* grpc=(\S+)`)

// roundTrip runs `ca server` and `agent` as the user would, and asks the
// agent's SDS socket for the workload's certificate and roots as Envoy
// does: the leaf names the token's identity and chains to the CA's root,
// which is ROOTCA.
func roundTrip(t *testing.T, ca, agent string) {
	work := testkit.ShortDir(t)
	const issuerURL = "https://meshid.dev.local"
	issuer, err := devissuer.LoadOrCreate(filepath.Join(work, "jwt"), issuerURL)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(work, "state")
	srv := start(t, ca, "server", "--state-dir", state,
		"--listen", "127.0.0.1:0", "--monitoring-listen", "127.0.0.1:0",
		"--jwks-file", filepath.Join(work, "jwt", devissuer.JWKSFile), "--jwt-issuer", issuerURL)
	addr := srv.wait(t, serving)[1]

	tok, err := issuer.Mint("skew", "workload", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(work, "token")
	if err := os.WriteFile(tokFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(work, "sds.sock")
	ag := start(t, agent, "--ca-addr", addr, "--ca-root", filepath.Join(state, "root-cert.pem"),
		"--token-file", tokFile, "--sds-socket", sock, "--monitoring-listen", "127.0.0.1:0")

	secrets := fetch(t, sock, ag, srv)
	want := spiffeid.RequireFromString("spiffe://cluster.local/ns/skew/sa/workload")
	caRoots, err := certs.ParseCertificates(mustRead(t, filepath.Join(state, "root-cert.pem")))
	if err != nil {
		t.Fatal(err)
	}
	var leaf *sdsfetch.Secret
	var roots []*x509.Certificate
	for _, s := range secrets {
		switch s.Name {
		case "default":
			leaf = s
		case "ROOTCA":
			roots = s.Roots
		}
	}
	if leaf == nil || len(leaf.Chain) == 0 || leaf.Key == nil || len(roots) == 0 {
		t.Fatalf("SDS answered %d secrets without a default certificate, its key and ROOTCA", len(secrets))
	}
	if len(leaf.Chain[0].URIs) != 1 || leaf.Chain[0].URIs[0].String() != want.String() {
		t.Fatalf("the leaf names %v, want %s", leaf.Chain[0].URIs, want)
	}
	if len(roots) != len(caRoots) || !roots[0].Equal(caRoots[0]) {
		t.Fatalf("ROOTCA holds %d roots, not the CA's root-cert.pem", len(roots))
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range leaf.Chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("the leaf does not chain to ROOTCA: %v", err)
	}
}

// fetch asks the agent's socket for default and ROOTCA until both arrive
// (the agent needs its first certificate from the CA) or a minute passes.
func fetch(t *testing.T, sock string, procs ...*proc) []*sdsfetch.Secret {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		secrets, err := sdsfetch.Fetch(ctx, sdsfetch.Config{Socket: sock, Names: []string{"default", "ROOTCA"}, NodeID: "skew"})
		cancel()
		if err == nil && len(secrets) == 2 {
			return secrets
		}
		if time.Now().After(deadline) {
			var out strings.Builder
			for _, p := range procs {
				fmt.Fprintf(&out, "--- %s\n%s", p.name, p.output())
			}
			t.Fatalf("no certificate over SDS in a minute: %v\n%s", err, out.String())
		}
		time.Sleep(200 * time.Millisecond) // the agent's process has no clock to inject: wall time
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// proc is a child process whose output lines the test reads.
type proc struct {
	name  string
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	more  chan struct{} // closed and replaced on each line
	done  chan struct{}
}

// start runs bin args..., interrupted (then killed) when the test ends.
func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: filepath.Base(bin) + " " + strings.Join(args, " "), cmd: exec.Command(bin, args...),
		more: make(chan struct{}), done: make(chan struct{})}
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, s.Text())
			close(p.more)
			p.more = make(chan struct{})
			p.mu.Unlock()
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		w.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Errorf("%s did not stop within 10s of SIGINT", p.name)
		}
	})
	return p
}

// wait returns the submatches of the first output line matching re.
func (p *proc) wait(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	timeout := time.After(time.Minute)
	for i := 0; ; {
		p.mu.Lock()
		for ; i < len(p.lines); i++ {
			if m := re.FindStringSubmatch(p.lines[i]); m != nil {
				p.mu.Unlock()
				return m
			}
		}
		more := p.more
		p.mu.Unlock()
		select {
		case <-more:
		case <-p.done:
			t.Fatalf("%s exited before %q:\n%s", p.name, re, p.output())
		case <-timeout:
			t.Fatalf("%s: no %q in a minute:\n%s", p.name, re, p.output())
		}
	}
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n") + "\n"
}
