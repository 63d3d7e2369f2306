package secretcache

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DefaultFileSecretDirs are the directories file-cert: and file-root:
// resources may name when Config.FileSecretDirs is nil: Istio's paths for
// mounted certificates. A relative directory is relative to the agent's
// working directory when New runs.
var DefaultFileSecretDirs = []string{"./etc/certs", "/etc/certs"}

// DefaultMaxFileSecretSize is the largest file a file secret may read.
// A PEM chain or bundle is a few KiB; a CA bundle of a few hundred roots
// stays well below.
const DefaultMaxFileSecretSize = 1 << 20

// errNoFile is the one answer for a file that is absent, outside the
// allowed directories, behind a symbolic link that leaves them, or not a
// regular file. The SDS socket must not tell these apart: it would be an
// oracle for the existence of any file the agent can see.
var errNoFile = errors.New("no such regular file under the file secret directories")

// fileNotFound is the error of Secret for a file name whose files are
// absent or not allowed; it wraps ErrUnknownResource (NotFound over SDS)
// and its message is the same in every case.
func fileNotFound(name string) error {
	return fmt.Errorf("%w %q: %w", ErrUnknownResource, name, errNoFile)
}

// fileDirs returns dirs as absolute, clean paths. nil means
// DefaultFileSecretDirs; an empty, non-nil slice allows no file secrets.
func fileDirs(dirs []string) ([]string, error) {
	if dirs == nil {
		dirs = DefaultFileSecretDirs
	}
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		if strings.TrimSpace(d) == "" {
			return nil, errors.New("secretcache: Config.FileSecretDirs holds an empty directory")
		}
		a, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("secretcache: file secret directory %q: %w", d, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// locate returns the allowed directory holding the clean, absolute path
// and the path relative to it. It looks at names only; openFile enforces
// the same bound on the file system.
func (m *Manager) locate(path string) (dir, rel string, ok bool) {
	for _, d := range m.fileDirs {
		r, err := filepath.Rel(d, path)
		if err != nil || r == "." || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			continue
		}
		return d, r, true
	}
	return "", "", false
}

// allowed reports whether every path of a file name lies, by name, in an
// allowed directory.
func (m *Manager) allowed(pn parsedName) bool {
	if _, _, ok := m.locate(pn.certPath); !ok {
		return false
	}
	if pn.kind == kindFileCert {
		if _, _, ok := m.locate(pn.keyPath); !ok {
			return false
		}
	}
	return true
}

// readSecretFile reads a file secret's file. The file must be a regular
// file inside an allowed directory and at most maxFileSize bytes; anything
// else is errNoFile (or, for a file that is too large, an error saying so).
//
// It is written by hand rather than with os.ReadFile because every step is
// a defence:
//   - os.Root resolves the path inside the allowed directory: a symbolic
//     link may point elsewhere in it (Kubernetes' ..data layout), but not
//     out of it, and the check holds against a link swapped in meanwhile.
//   - Stat before opening refuses devices and FIFOs without opening them
//     (opening a device can have side effects).
//   - O_NONBLOCK: a FIFO swapped in after the Stat opens at once instead of
//     pinning a thread until a writer appears, and the Stat of the opened
//     file refuses it before any read.
//   - The read goes through a limit, so /dev/zero-like content cannot
//     exhaust memory even if a regular file grows while it is read.
func (m *Manager) readSecretFile(path string) ([]byte, error) {
	dir, rel, ok := m.locate(path)
	if !ok {
		return nil, errNoFile
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, errNoFile
	}
	defer root.Close()
	if fi, err := root.Stat(rel); err != nil || !fi.Mode().IsRegular() {
		return nil, errNoFile
	}
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, errNoFile
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, errNoFile
	}
	if fi.Size() > m.maxFileSize {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes", path, m.maxFileSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, m.maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > m.maxFileSize {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes", path, m.maxFileSize)
	}
	return b, nil
}
