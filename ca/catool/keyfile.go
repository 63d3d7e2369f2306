package catool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrInsecureOutput is the refusal of CreateKeyFile; `meshid certs leaf`
// overrides it only with --force-insecure-output.
var ErrInsecureOutput = errors.New("refusing to write a private key there without --force-insecure-output")

// CreateKeyFile writes a private key to path, which must be a new file, as
// mode 0600. It refuses (ErrInsecureOutput) an existing path of any kind (a
// file, a symbolic link even dangling, a directory) and a directory that
// another user could write to or owns, where someone else could read the
// key through a file they placed or swap the file after it is written. The
// file is created with O_EXCL|O_NOFOLLOW, so a link planted between the
// checks and the create is refused too.
func CreateKeyFile(path string, data []byte) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s exists: %w", path, ErrInsecureOutput)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %v", path, err)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("%s: %v", dir, err)
	}
	if err := privateDir(dir, st); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %v: %w", path, err, ErrInsecureOutput)
	}
	err = f.Chmod(0o600) // whatever the umask; it can only have narrowed it
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("%s: %v", path, err)
	}
	return nil
}

// privateDir refuses a directory that a user other than this one (or
// root) owns or may write to.
func privateDir(dir string, st fs.FileInfo) error {
	if !st.IsDir() {
		return fmt.Errorf("%s: not a directory", dir)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %o): %w", dir, st.Mode().Perm(), ErrInsecureOutput)
	}
	if uid, ok := owner(st); ok && uid != os.Geteuid() && uid != 0 {
		return fmt.Errorf("%s is owned by uid %d: %w", dir, uid, ErrInsecureOutput)
	}
	return nil
}
