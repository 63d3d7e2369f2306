package certs

// RenewAtWith exposes renewAt with a fixed random draw u in [0,1).
var RenewAtWith = renewAt

// SetSyncDir replaces the directory fsync for a test; restore puts it back.
func SetSyncDir(f func(dir string) error) (restore func()) {
	old := syncDir
	syncDir = f
	return func() { syncDir = old }
}

// SyncDir is the real directory fsync.
var SyncDir = syncDir
