//go:build !unix

package catool

import "io/fs"

// oNoFollow does not exist off Unix; O_EXCL still refuses an existing path.
const oNoFollow = 0

// owner is unknown off Unix: only the mode bits are checked.
func owner(fs.FileInfo) (int, bool) { return 0, false }
