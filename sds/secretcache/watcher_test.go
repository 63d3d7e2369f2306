package secretcache_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// inotifyWatchesOn counts the inotify watches this process holds on dir:
// the kernel lists each watch of an inotify descriptor in its
// /proc/self/fdinfo entry, with the watched inode.
func inotifyWatchesOn(t *testing.T, dir string) int {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	ino := fmt.Sprintf(" ino:%x ", fi.Sys().(*syscall.Stat_t).Ino)
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err != nil || target != "anon_inode:inotify" {
			continue
		}
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(info), "\n") {
			if strings.HasPrefix(line, "inotify wd:") && strings.Contains(line, ino) {
				n++
			}
		}
	}
	return n
}

// The attack: watches never given back. Each watched directory holds an
// inotify watch, of which a user has a bounded number
// (fs.inotify.max_user_watches), and clients choose the names. A directory
// is watched while a file in it is watched, and only then: a watcher that
// leaves does not stop the pushes to the others of its name or of its
// directory, and the last one gives the directory's watch back.
func TestFileDirectoryWatchedWhileNeeded(t *testing.T) {
	dir := t.TempDir()
	pathA, pathB := filepath.Join(dir, "a.pem"), filepath.Join(dir, "b.pem")
	writeFile(t, pathA, newPair(t, "a").certPEM)
	writeFile(t, pathB, newPair(t, "b").certPEM)
	nameA, nameB := secretcache.FileRootPrefix+pathA, secretcache.FileRootPrefix+pathB
	f := allowIn(t, dir)
	f.run(t)
	watchA := func() (<-chan *secretcache.Secret, func()) {
		ch := make(chan *secretcache.Secret, 10)
		return ch, f.m.Watch(nameA, func(s *secretcache.Secret) { ch <- s })
	}
	chA1, cancelA1 := watchA()
	chA2, cancelA2 := watchA()
	defer cancelA2()
	chB := make(chan *secretcache.Secret, 10)
	cancelB := f.m.Watch(nameB, func(s *secretcache.Secret) { chB <- s })
	defer cancelB()
	mustSecret(t, f.m, nameA)
	mustSecret(t, f.m, nameB)
	receive(t, chA1, "first load of a")
	receive(t, chA2, "first load of a")
	receive(t, chB, "first load of b")
	f.logs.WaitForContaining(t, "watching directory", 1)
	if n := inotifyWatchesOn(t, dir); n != 1 {
		t.Fatalf("%d inotify watches on the directory of two watched files, want 1", n)
	}
	change := func(what string) {
		t.Helper()
		next := newPair(t, "a-next")
		writeFile(t, pathA, next.certPEM)
		if s := receive(t, chA2, what); !s.Roots[0].Equal(next.cert) {
			t.Fatalf("%s: pushed root is not the new one", what)
		}
	}

	cancelA1() // one of a's two watchers leaves
	change("a changed after its other watcher left")
	cancelB() // b's only watcher leaves; a is still watched in the directory
	if n := inotifyWatchesOn(t, dir); n != 1 {
		t.Fatalf("%d inotify watches on the directory once b is no longer watched, want 1 (a is)", n)
	}
	change("a changed after b's watcher left")
	cancelA2() // the last watcher of the directory's files
	if n := inotifyWatchesOn(t, dir); n != 0 {
		t.Fatalf("%d inotify watches on the directory after its last file's watcher left, want 0", n)
	}
	if len(chA1) != 0 {
		t.Fatal("a watcher was called after its cancel")
	}

	// Watched again, the directory is watched again.
	chA3, cancelA3 := watchA()
	defer cancelA3()
	f.logs.WaitForContaining(t, "watching directory", 2)
	if n := inotifyWatchesOn(t, dir); n != 1 {
		t.Fatalf("%d inotify watches on the directory watched again, want 1", n)
	}
	next := newPair(t, "a-again")
	writeFile(t, pathA, next.certPEM)
	if s := receive(t, chA3, "a changed once watched again"); !s.Roots[0].Equal(next.cert) {
		t.Fatal("pushed root is not the new one")
	}
}
