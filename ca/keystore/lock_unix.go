//go:build unix

package keystore

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive flock on dir/.lock, waiting for another holder
// (another meshid on the same state directory) to finish. The kernel drops
// the lock when its holder exits, so a crashed process never leaves it
// behind. The returned function releases it.
func lockDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("keystore: lock state directory: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("keystore: lock state directory %s (is it on a file system without flock?): %w", path, err)
	}
	return func() { f.Close() }, nil // closing the file drops the lock
}
