package secretcache_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshid/meshid/sds/secretcache"
)

// inotifyInstances counts this process's inotify file descriptors.
func inotifyInstances(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// A running Manager holds an inotify instance only once a file secret is in
// use, so that a process can run more Managers than a user may have inotify
// instances (often 128); a file asked for after Run started is still watched.
func TestFileWatcherOnlyWhenNeeded(t *testing.T) {
	before := inotifyInstances(t)
	fixtures := make([]*fixture, 200)
	for i := range fixtures {
		fixtures[i] = newFixture(t, nil)
		fixtures[i].run(t)
		mustSecret(t, fixtures[i].m, secretcache.DefaultName)
	}
	if n := inotifyInstances(t) - before; n != 0 {
		t.Fatalf("200 Managers serving only default hold %d inotify instances, want 0", n)
	}

	dir := t.TempDir()
	p1, p2 := newPair(t, "one"), newPair(t, "two")
	path := filepath.Join(dir, "root.pem")
	writeFile(t, path, p1.certPEM)
	f := fixtures[0]
	name := secretcache.FileRootPrefix + path
	ch := watch(t, f.m, name)
	if s := mustSecret(t, f.m, name); !s.Roots[0].Equal(p1.cert) {
		t.Fatal("wrong root")
	}
	f.logs.WaitForContaining(t, "watching directory", 1)
	if n := inotifyInstances(t) - before; n != 1 {
		t.Fatalf("%d inotify instances once a file is in use, want 1", n)
	}
	if s := receive(t, ch, "first load"); !s.Roots[0].Equal(p1.cert) {
		t.Fatal("first push is not the loaded root")
	}
	writeFile(t, path, p2.certPEM)
	if s := receive(t, ch, "file changed"); !s.Roots[0].Equal(p2.cert) {
		t.Fatal("pushed root is not the new one")
	}
}
