package unixsock

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// MaxPath is the longest path a Unix socket address holds on Linux
// (sun_path is 108 bytes including the terminating NUL).
const MaxPath = 107

// Listen creates the socket at path with the given mode. It creates the
// parent directory when missing (0700, or 0750 when the mode grants the
// group access), removes a stale socket left by a dead agent, and refuses to
// start when a live agent answers on path or path is not a socket.
//
// The socket is bound under a temporary name in the same directory, chmod-ed,
// and then hard-linked to path, so that it never exists at path with the
// umask's mode, and two agents racing for one path cannot both win: the
// link fails when path exists. It returns the listener and the socket's file
// info, used to remove only our own socket at shutdown.
func Listen(path string, mode os.FileMode) (*net.UnixListener, os.FileInfo, error) {
	if len(path) > MaxPath {
		return nil, nil, fmt.Errorf("unixsock: socket path %q is %d bytes, longer than the %d a Unix socket allows", path, len(path), MaxPath)
	}
	dir := filepath.Dir(path)
	dirMode := os.FileMode(0o700)
	if mode&0o070 != 0 {
		dirMode = 0o750
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, nil, fmt.Errorf("unixsock: create socket directory: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, nil, err
	}

	tmp := filepath.Join(dir, "."+filepath.Base(path)+"."+strconv.Itoa(os.Getpid()))
	if len(tmp) > MaxPath {
		// The temporary name does not fit: bind in place. The directory
		// protects the socket until the chmod when we created it.
		tmp = path
	}
	if tmp != path {
		if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("unixsock: remove leftover %s: %w", tmp, err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("unixsock: listen on %s: %w", path, err)
	}
	// We remove the socket ourselves, by path and only if it is still ours.
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, nil, err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Errorf("unixsock: chmod socket: %w", err))
	}
	if tmp != path {
		if err := os.Link(tmp, path); err != nil {
			if errors.Is(err, os.ErrExist) {
				return fail(fmt.Errorf("unixsock: %s appeared while starting; another agent is starting on it", path))
			}
			return fail(fmt.Errorf("unixsock: link socket to %s: %w", path, err))
		}
		if err := os.Remove(tmp); err != nil {
			os.Remove(path)
			return fail(fmt.Errorf("unixsock: remove %s: %w", tmp, err))
		}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("unixsock: stat socket: %w", err))
	}
	return ln, fi, nil
}

// removeStale removes path if it is a socket nobody listens on. It refuses
// when an agent answers or path is something else than a socket.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unixsock: stat %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("unixsock: %s exists and is not a socket; refusing to replace it", path)
	}
	// Connecting to a Unix socket does not wait: it succeeds when someone
	// listens and fails with ECONNREFUSED when the socket is stale.
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("unixsock: another agent is serving on %s; refusing to start", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("unixsock: probing %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unixsock: remove stale socket %s: %w", path, err)
	}
	return nil
}

// Remove removes path if it is still the socket described by ours.
func Remove(path string, ours os.FileInfo) {
	fi, err := os.Lstat(path)
	if err == nil && os.SameFile(fi, ours) {
		os.Remove(path)
	}
}

// DefaultMode is the mode of a socket whose server's Config gives none:
// only the agent's user may connect.
const DefaultMode os.FileMode = 0o600

// CheckSocket checks the socket of a server's Config (sds, workloadapi):
// its path, required (see CheckPath), and its mode, 0 meaning DefaultMode
// (see CheckMode). It returns the mode to serve with.
func CheckSocket(path string, mode os.FileMode) (os.FileMode, error) {
	if path == "" {
		return 0, errors.New("Config.SocketPath is required")
	}
	if err := CheckPath(path); err != nil {
		return 0, err
	}
	mode = cmp.Or(mode, DefaultMode)
	return mode, CheckMode(mode)
}

// CheckMode returns an error unless mode is a socket mode the agent
// accepts: owner read-write, no access for others (0600, or 0660 for the
// group). The sockets hand out private keys.
func CheckMode(mode os.FileMode) error {
	if mode&^os.ModePerm != 0 || mode&0o007 != 0 || mode&0o600 != 0o600 {
		return fmt.Errorf("socket mode %#o: want owner read-write and no access for others, such as 0600 or 0660", mode)
	}
	return nil
}
