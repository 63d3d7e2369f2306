package node

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// LockPath is the machine-wide lock every suite that runs a node holds:
// one kubelet fits per machine (ports 10250 and 10248, the kubepods
// cgroups, the bridge).
const LockPath = "/run/lock/meshid-node.lock"

// Lock is the held machine-wide node lock.
type Lock struct{ f *os.File }

// AcquireLock waits for the machine-wide node lock (another suite's node
// may be running) and returns it held.
func AcquireLock() (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(LockPath), 0o755); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("node: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("node: lock %s: %w", LockPath, err)
	}
	return &Lock{f: f}, nil
}

// Release lets the next suite's node start.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the only descriptor releases the flock
	l.f = nil
	return err
}

// CheckCanRun says why a node cannot run here, or nil: it needs root (the
// kubelet and containerd mount, create cgroups and network namespaces),
// containerd, runc and ctr on the PATH, the CNI plugins in CNIBinDir, and
// iptables and ip for kube-proxy, the CNI firewall and the cleanup.
func CheckCanRun() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("the node suite needs root (the kubelet and containerd mount file systems and create cgroups and network namespaces): run it as root, as CI does"))
	}
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			errs = append(errs, fmt.Errorf("%s is not on the PATH (Debian: apt-get install containerd runc iptables iproute2)", bin))
		}
	}
	for _, p := range []string{"bridge", "host-local", "firewall", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			errs = append(errs, fmt.Errorf("CNI plugin %s missing in %s (Debian: apt-get install containernetworking-plugins)", p, CNIBinDir))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: cannot run a node on this machine:\n%w", err)
	}
	return nil
}
