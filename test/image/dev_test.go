//go:build image

package image_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshid/meshid/testkit"
)

// wantID is the identity of the token `meshid dev` writes (default/default).
const wantID = "spiffe://cluster.local/ns/default/sa/default"

// caPort is the CA's port inside the container.
const caPort = "15012"

// testDev runs `meshid dev` in a container, its state directory a
// bind-mounted host directory and its CA port published on 127.0.0.1, and
// checks from the host: the files it writes are 65532's (the SDS socket
// 0600), the process runs as 65532 with no capability and no_new_privs,
// `meshid inspect --sds` reads its SDS socket through the mount, a host
// `meshid-agent` gets a certificate from its CA through the published port,
// and the agent image alone gets one from it over the container network.
func testDev(t *testing.T, im images) {
	if os.Geteuid() != 0 {
		// The container writes the state directory as 65532 and its socket
		// 0600: only root on the host can hand the directory over and
		// connect.
		skipOrFail(t, "needs root: the state directory is chowned to 65532 and its SDS socket is 0600")
	}
	netName, caIP := newNetwork(t)
	state := sharedDir(t)
	dev := name("dev")
	// The CA listens on the container's own address (fixed with --ip): a
	// published port reaches that address, not the container's loopback,
	// and meshid dev's in-process agent dials the CA at its listen address,
	// which the serving certificate carries only when it is a concrete IP
	// (with --listen 0.0.0.0:15012 the agent dials [::] and fails TLS).
	startContainer(t, dev, im.meshid,
		[]string{"--network", netName, "--ip", caIP, "-p", "127.0.0.1::" + caPort,
			"--tmpfs", "/tmp", "-v", state + ":/state"},
		"dev", "--state-dir", "/state", "--listen", net.JoinHostPort(caIP, caPort))

	sock := filepath.Join(state, "sds.sock")
	rep := waitServed(t, im, sock, dev)
	checkServed(t, "meshid dev's agent", rep)
	checkOwnedByNonroot(t, state)
	checkProcess(t, dev)

	t.Run("host meshid-agent via the published port", func(t *testing.T) {
		hostPort := strings.TrimSpace(docker(t, "port", dev, caPort+"/tcp"))
		if i := strings.IndexByte(hostPort, '\n'); i >= 0 { // one line per address family
			hostPort = hostPort[:i]
		}
		if !strings.HasPrefix(hostPort, "127.0.0.1:") {
			t.Fatalf("CA port published on %q, want 127.0.0.1 only", hostPort)
		}
		agentSock := filepath.Join(testkit.ShortDir(t), "agent.sock")
		startHostAgent(t, im, "--ca-addr", hostPort,
			"--ca-root", filepath.Join(state, "root-cert.pem"),
			"--token-file", filepath.Join(state, "token"),
			"--sds-socket", agentSock, "--monitoring-listen", "")
		rep := waitServed(t, im, agentSock, dev, "--roots", filepath.Join(state, "root-cert.pem"))
		checkServed(t, "the host meshid-agent", rep)
	})

	t.Run("agent image", func(t *testing.T) {
		run := sharedDir(t)
		agent := name("agent")
		startContainer(t, agent, im.agent,
			[]string{"--network", netName, "-v", state + ":/state:ro", "-v", run + ":/run/meshid"},
			"--ca-addr", net.JoinHostPort(caIP, caPort),
			"--ca-root", "/state/root-cert.pem", "--token-file", "/state/token",
			"--sds-socket", "/run/meshid/sds.sock", "--monitoring-listen", "")
		rep := waitServed(t, im, filepath.Join(run, "sds.sock"), agent, "--roots", filepath.Join(state, "root-cert.pem"))
		checkServed(t, "the meshid-agent image", rep)
		checkOwnedByNonroot(t, run)
		checkProcess(t, agent)
	})
}

// newNetwork creates a Docker network of this run with a subnet of its own,
// removed when the test ends, and returns its name and an address in it.
// `--ip` needs a subnet named at creation: the engine first picks a free one.
func newNetwork(t *testing.T) (netName, ip string) {
	t.Helper()
	netName = name("net")
	docker(t, "network", "create", netName)
	var ipam []struct{ Subnet string }
	dockerJSON(t, &ipam, "network", "inspect", "--format", "{{json .IPAM.Config}}", netName)
	docker(t, "network", "rm", netName)
	if len(ipam) == 0 {
		t.Fatalf("network %s has no subnet", netName)
	}
	_, subnet, err := net.ParseCIDR(ipam[0].Subnet)
	if err != nil || subnet.IP.To4() == nil {
		t.Fatalf("network %s: subnet %q (%v)", netName, ipam[0].Subnet, err)
	}
	docker(t, "network", "create", "--subnet", subnet.String(), netName)
	t.Cleanup(func() {
		if _, stderr, err := dockerRun(t, "network", "rm", netName); err != nil {
			t.Errorf("removing network %s: %v\n%s", netName, err, stderr)
		}
	})
	addr := subnet.IP.To4()
	addr[3] = 10
	return netName, addr.String()
}

// sharedDir is a new host directory owned by 65532, for a container to
// write; it is removed when the test ends.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := testkit.ShortDir(t)
	if err := os.Chown(dir, nonroot, nonroot); err != nil {
		t.Fatal(err)
	}
	return dir
}

// inspectReport is the part of `meshid inspect -o json` these tests read.
type inspectReport struct {
	Status  string `json:"status"`
	Valid   bool   `json:"valid"`
	Results []struct {
		Name            string     `json:"name"`
		Valid           bool       `json:"valid"`
		SPIFFEID        string     `json:"spiffe_id"`
		NotAfter        *time.Time `json:"not_after"`
		VerifiedAgainst string     `json:"verified_against"`
	} `json:"results"`
}

// waitServed runs the host's `meshid inspect --sds sock -o json` until it
// reports everything valid and returns that report. It fails the test if
// container (the server's) exits first or that takes longer than guard.
func waitServed(t *testing.T, im images, sock, container string, extra ...string) *inspectReport {
	t.Helper()
	args := append([]string{"inspect", "--sds", sock, "-o", "json", "--timeout", "5s"}, extra...)
	// Polling is the only way to watch another process's socket appear;
	// each attempt is bounded by --timeout, the whole by guard.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(guard)
	defer deadline.Stop()
	var last string
	for {
		if _, err := os.Stat(sock); err == nil {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(filepath.Join(im.bin, "meshid"), args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if err == nil {
				rep := &inspectReport{}
				if err := json.Unmarshal(stdout.Bytes(), rep); err != nil {
					t.Fatalf("meshid inspect -o json printed invalid JSON: %v\n%s", err, stdout.String())
				}
				return rep
			}
			last = fmt.Sprintf("meshid %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		} else {
			last = err.Error()
		}
		if running := strings.TrimSpace(docker(t, "inspect", "--format", "{{.State.Running}}", container)); running != "true" {
			t.Fatalf("container %s exited before serving on %s: %s", container, sock, last)
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s did not serve valid secrets on %s within %v: %s", container, sock, guard, last)
		}
	}
}

// checkServed fails unless rep shows the default certificate of wantID and
// the ROOTCA, both valid, the certificate verified against a root.
func checkServed(t *testing.T, who string, rep *inspectReport) {
	t.Helper()
	if rep.Status != "ok" || !rep.Valid || len(rep.Results) != 2 {
		t.Fatalf("%s serves: %+v", who, rep)
	}
	for _, r := range rep.Results {
		if !r.Valid || r.NotAfter == nil || !r.NotAfter.After(time.Now()) {
			t.Errorf("%s serves %s: %+v", who, r.Name, r)
		}
		if r.Name == "default" && (r.SPIFFEID != wantID || r.VerifiedAgainst == "") {
			t.Errorf("%s serves default as %q verified against %q, want %s verified", who, r.SPIFFEID, r.VerifiedAgainst, wantID)
		}
	}
	t.Logf("%s serves %s, valid", who, wantID)
}

// checkOwnedByNonroot fails unless every file a container wrote into dir is
// 65532's, keys and sockets 0600.
func checkOwnedByNonroot(t *testing.T, dir string) {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		names = append(names, fmt.Sprintf("%s %v", d.Name(), fi.Mode()))
		if st.Uid != nonroot || st.Gid != nonroot {
			t.Errorf("%s is owned by %d:%d, want the container's 65532:65532", p, st.Uid, st.Gid)
		}
		secret := fi.Mode()&fs.ModeSocket != 0 || strings.Contains(d.Name(), "key") || d.Name() == "token"
		if secret && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v, want 0600", p, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("written by the container: %s", strings.Join(names, ", "))
}

// checkProcess reads a running container's process status from the host's
// /proc: the kernel's word that it runs as 65532:65532, without root's
// group, with no capability and with no_new_privs.
func checkProcess(t *testing.T, container string) {
	t.Helper()
	var pid int
	dockerJSON(t, &pid, "inspect", "--format", "{{json .State.Pid}}", container)
	if pid <= 0 {
		t.Fatalf("container %s is not running (pid %d)", container, pid)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			status[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	want := map[string]string{
		"Uid":        "65532 65532 65532 65532",
		"Gid":        "65532 65532 65532 65532",
		"CapInh":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapEff":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"CapAmb":     "0000000000000000",
		"NoNewPrivs": "1",
	}
	for k, v := range want {
		if status[k] != v {
			t.Errorf("container %s (pid %d): %s %q, want %q", container, pid, k, status[k], v)
		}
	}
	for _, g := range strings.Fields(status["Groups"]) {
		if g == "0" {
			t.Errorf("container %s is in group 0 (Groups %q)", container, status["Groups"])
		}
	}
}

// startHostAgent runs the static meshid-agent on the host until the test
// ends, when it is interrupted as Ctrl-C would and must exit 0.
func startHostAgent(t *testing.T, im images, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(im.bin, "meshid-agent"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		var err error
		select {
		case err = <-exited:
		case <-time.After(guard):
			_ = cmd.Process.Kill()
			err = fmt.Errorf("still running %v after SIGINT: %w", guard, <-exited)
		}
		if err != nil {
			t.Errorf("host meshid-agent did not exit cleanly on SIGINT: %v", err)
		}
		if t.Failed() {
			t.Logf("host meshid-agent output:\n%s", lastLines(out.String(), 40))
		}
	})
}
