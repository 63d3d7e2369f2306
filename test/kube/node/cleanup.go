package node

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// cleaner removes what a node leaves on the machine outside its
// directory's files: processes (containerd's shims, containers), mounts
// (the kubelet's root bind-mounts itself, pods' volumes, overlay root file
// systems, sandboxes' /dev/shm), the kubepods cgroups, the bridge, and
// the iptables chains of kube-proxy, the kubelet and the CNI firewall. It runs before a node starts (what a killed
// run left) and after it stops.
type cleaner struct {
	// marks: a path that names the node's directory; processes whose
	// command line holds one, and mounts under one, are the node's.
	marks     []string
	bridge    string
	kubeProxy string // binary, for --cleanup
}

func (c cleaner) run() error {
	var errs []error
	c.killProcesses()
	errs = append(errs, c.unmount(), c.removeCgroups(), c.deleteBridge(), c.cleanupKubeProxy(), c.cleanupIptables())
	return errors.Join(errs...)
}

func (c cleaner) ours(s string) bool {
	for _, m := range c.marks {
		if m != "" && strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// killProcesses kills the shims of the node's containerd (their command
// line names its socket) and every process left in a kubepods cgroup.
func (c cleaner) killProcesses() {
	pids := map[int]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), "containerd-shim") && c.ours(string(cmdline)) {
			pids[pid] = true
		}
	}
	for _, dir := range kubepodsDirs() {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids[pid] = true
				}
			}
			return nil
		})
	}
	for pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for pid := range pids {
		// Reap what is ours to reap; wait for the rest to go.
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		for i := 0; i < 200; i++ {
			if syscall.Kill(pid, 0) != nil {
				break
			}
			waitTick()
		}
	}
}

// unmount detaches every mount under the node's directory, deepest first.
func (c cleaner) unmount() error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && c.ours(fields[4]) {
			points = append(points, unescapeMount(fields[4]))
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("node: umount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// kubepodsDirs are the kubelet's cgroups (cgroupfs driver), in every v1
// hierarchy and in the unified one.
func kubepodsDirs() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if st, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil && st.IsDir() {
		dirs = append(dirs, "/sys/fs/cgroup/kubepods")
	}
	return dirs
}

// removeCgroups removes the kubepods cgroups, children first (a cgroup
// directory is removed with rmdir, once it holds no process).
func (c cleaner) removeCgroups() error {
	var errs []error
	for _, root := range kubepodsDirs() {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("node: rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (c cleaner) deleteBridge() error {
	if _, err := os.Stat(filepath.Join("/sys/class/net", c.bridge)); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "delete", c.bridge).CombinedOutput(); err != nil {
		return fmt.Errorf("node: ip link delete %s: %w: %s", c.bridge, err, out)
	}
	return nil
}

// cleanupKubeProxy removes kube-proxy's chains and rules (kube-proxy
// --cleanup, which leaves everything else alone).
func (c cleaner) cleanupKubeProxy() error {
	if c.kubeProxy == "" {
		return nil
	}
	if out, err := exec.Command(c.kubeProxy, "--cleanup", "--proxy-mode=iptables").CombinedOutput(); err != nil {
		return fmt.Errorf("node: kube-proxy --cleanup: %w: %s", err, out)
	}
	return nil
}

// cleanupIptables removes the chains the kubelet (KUBE-FIREWALL, its
// canaries) and the CNI firewall plugin (CNI-FORWARD, CNI-ADMIN) leave in
// iptables and ip6tables, and the rules that jump to them, with one
// iptables-restore --noflush per table; kube-proxy's own are gone by then.
// Only chains named KUBE-* or CNI-* are touched.
func (c cleaner) cleanupIptables() error {
	var errs []error
	for _, fam := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(fam + "-save"); err != nil {
			continue
		}
		for _, table := range []string{"filter", "nat", "mangle"} {
			out, err := exec.Command(fam+"-save", "-t", table).Output()
			if err != nil {
				continue // no such table in this family
			}
			script := iptablesCleanupScript(table, string(out))
			if script == "" {
				continue
			}
			cmd := exec.Command(fam+"-restore", "--noflush")
			cmd.Stdin = strings.NewReader(script)
			if b, err := cmd.CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("node: %s-restore (%s): %w: %s", fam, table, err, b))
			}
		}
	}
	return errors.Join(errs...)
}

func ourChain(name string) bool {
	return strings.HasPrefix(name, "KUBE-") || strings.HasPrefix(name, "CNI-")
}

// iptablesCleanupScript is the iptables-restore input that deletes, from
// one table's iptables-save output, every rule of another chain jumping
// to a KUBE-* or CNI-* chain, then flushes and deletes those chains; empty
// when there are none.
func iptablesCleanupScript(table, save string) string {
	var chains, deletes []string
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			if name, _, _ := strings.Cut(line[1:], " "); ourChain(name) {
				chains = append(chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 || ourChain(f[1]) {
				continue
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && ourChain(f[i+1]) {
					deletes = append(deletes, "-D"+line[2:])
					break
				}
			}
		}
	}
	if len(chains) == 0 && len(deletes) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, d := range deletes {
		b.WriteString(d + "\n")
	}
	for _, ch := range chains {
		fmt.Fprintf(&b, "-F %s\n", ch)
	}
	for _, ch := range chains {
		fmt.Fprintf(&b, "-X %s\n", ch)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
