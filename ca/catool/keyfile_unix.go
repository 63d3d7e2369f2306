//go:build unix

package catool

import (
	"io/fs"
	"syscall"
)

const oNoFollow = syscall.O_NOFOLLOW

// owner is the uid owning the file of st.
func owner(st fs.FileInfo) (int, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(sys.Uid), true
}
