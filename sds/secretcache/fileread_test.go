package secretcache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// allowIn returns a fixture whose file secrets may come only from dir.
func allowIn(t *testing.T, dir string) *fixture {
	t.Helper()
	return newFixture(t, func(c *secretcache.Config) { c.FileSecretDirs = []string{dir} })
}

// notFound asserts that name is refused with the one "no such file" error,
// and returns that error's text with the name taken out, so that callers
// can compare the refusals of different names.
func notFound(t *testing.T, m *secretcache.Manager, name string) string {
	t.Helper()
	_, err := m.Secret(context.Background(), name)
	if !errors.Is(err, secretcache.ErrUnknownResource) || errors.Is(err, secretcache.ErrNotReady) {
		t.Fatalf("Secret(%q) = %v, want ErrUnknownResource", name, err)
	}
	return strings.ReplaceAll(err.Error(), name, "NAME")
}

// The attack: the agent's user can read the CA key (meshid dev) or any
// other file; a client of the socket asks for it as a file resource. Files
// outside the allowed directories are refused, and with the same error as
// an absent file inside them, so that the socket tells nothing about which
// files exist.
func TestFileOutsideAllowedDirsRefused(t *testing.T) {
	allowed, outside := t.TempDir(), t.TempDir()
	p := newPair(t, "secret")
	writeFile(t, filepath.Join(outside, "ca-cert.pem"), p.certPEM)
	writeFile(t, filepath.Join(outside, "ca-key.pem"), p.keyPEM)
	writeFile(t, filepath.Join(allowed, "root.pem"), p.certPEM)
	mustSymlink(t, filepath.Join("..", filepath.Base(outside), "ca-cert.pem"), filepath.Join(allowed, "escape.pem"))
	f := allowIn(t, allowed)

	absent := notFound(t, f.m, secretcache.FileRootPrefix+filepath.Join(allowed, "absent.pem"))
	for _, name := range []string{
		secretcache.FileRootPrefix + filepath.Join(outside, "ca-cert.pem"),
		secretcache.FileCertPrefix + filepath.Join(outside, "ca-cert.pem") + "~" + filepath.Join(outside, "ca-key.pem"),
		// The certificate inside, the key outside.
		secretcache.FileCertPrefix + filepath.Join(allowed, "root.pem") + "~" + filepath.Join(outside, "ca-key.pem"),
		// Out through "..", and through a symbolic link.
		secretcache.FileRootPrefix + filepath.Join(allowed, "..", filepath.Base(outside), "ca-cert.pem"),
		secretcache.FileRootPrefix + allowed + "/../" + filepath.Base(outside) + "/ca-cert.pem",
		secretcache.FileRootPrefix + filepath.Join(allowed, "escape.pem"),
		// The directory itself, and one that does not exist.
		secretcache.FileRootPrefix + allowed,
		secretcache.FileRootPrefix + filepath.Join(outside, "absent.pem"),
		secretcache.FileRootPrefix + "/etc/passwd",
	} {
		if got := notFound(t, f.m, name); got != absent {
			t.Errorf("refusal of %q differs from an absent file's:\n%s\n%s", name, got, absent)
		}
		cancel := f.m.Watch(name, func(*secretcache.Secret) {})
		if n := f.m.Watchers(name); n != 0 && !strings.Contains(name, "escape") {
			t.Errorf("%d watchers for %q outside the allowed directory", n, name)
		}
		cancel()
	}
	if s := mustSecret(t, f.m, secretcache.FileRootPrefix+filepath.Join(allowed, "root.pem")); !s.Roots[0].Equal(p.cert) {
		t.Fatal("the allowed file is not served")
	}
	if strings.Contains(f.logs.All(), string(p.keyPEM[40:80])) {
		t.Fatal("key material in the logs")
	}
}

// No file resources at all when the Config says so (meshid dev, whose
// state directory holds the CA key).
func TestNoFileSecretDirs(t *testing.T) {
	dir := t.TempDir()
	p := newPair(t, "root")
	writeFile(t, filepath.Join(dir, "root.pem"), p.certPEM)
	f := newFixture(t, func(c *secretcache.Config) { c.FileSecretDirs = []string{} })
	notFound(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "root.pem"))
}

// Without FileSecretDirs the Istio paths are allowed: ./etc/certs and
// /etc/certs.
func TestDefaultFileSecretDirs(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.MkdirAll(filepath.Join("etc", "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := newPair(t, "root")
	writeFile(t, filepath.Join("etc", "certs", "root-cert.pem"), p.certPEM)
	writeFile(t, "root.pem", p.certPEM)
	f := newFixture(t, func(c *secretcache.Config) { c.FileSecretDirs = nil })
	if s := mustSecret(t, f.m, secretcache.FileRootPrefix+"./etc/certs/root-cert.pem"); !s.Roots[0].Equal(p.cert) {
		t.Fatal("wrong root")
	}
	notFound(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "root.pem"))
	if got := secretcache.DefaultFileSecretDirs; len(got) != 2 || got[0] != "./etc/certs" || got[1] != "/etc/certs" {
		t.Fatalf("DefaultFileSecretDirs = %v", got)
	}
}

// The attack: file-root:/dev/zero made the agent read until it ran out of
// memory; a FIFO pinned a thread in open(2) and blocked every other file
// reload, and shutdown with it. Devices, FIFOs and directories are refused
// without being read (and a FIFO without blocking), like absent files.
func TestFileSpecialFilesRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	mustSymlink(t, "fifo.pem", filepath.Join(dir, "link-to-fifo.pem"))
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	p := newPair(t, "root")
	writeFile(t, filepath.Join(dir, "root.pem"), p.certPEM)
	f := newFixture(t, func(c *secretcache.Config) { c.FileSecretDirs = []string{dir, "/dev"} })
	absent := notFound(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "absent.pem"))

	// Run the reads on another goroutine and bound them with a context
	// deadline: a read that blocks fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, name := range []string{
			secretcache.FileRootPrefix + fifo,
			secretcache.FileRootPrefix + filepath.Join(dir, "link-to-fifo.pem"),
			secretcache.FileCertPrefix + filepath.Join(dir, "root.pem") + "~" + fifo,
			secretcache.FileRootPrefix + "/dev/zero",
			secretcache.FileRootPrefix + "/dev/urandom",
			secretcache.FileRootPrefix + filepath.Join(dir, "sub"),
		} {
			if got := notFound(t, f.m, name); got != absent {
				t.Errorf("refusal of %q differs from an absent file's:\n%s\n%s", name, got, absent)
			}
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("reading a special file blocked")
	}
	// A watched FIFO blocks no reload of another file either.
	watch(t, f.m, secretcache.FileRootPrefix+fifo)
	ch := watch(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "root.pem"))
	mustSecret(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "root.pem"))
	receive(t, ch, "first load")
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 1)
	q := newPair(t, "next")
	writeFile(t, filepath.Join(dir, "root.pem"), q.certPEM)
	if s := receive(t, ch, "reload beside a FIFO"); !s.Roots[0].Equal(q.cert) {
		t.Fatal("wrong root after the reload")
	}
}

// A file above the size limit is read no further than the limit and not
// served; one at the limit is, to its last byte.
func TestFileSizeLimit(t *testing.T) {
	dir := t.TempDir()
	p := newPair(t, "root")
	pad := func(n int) []byte { // a valid bundle after blank lines, n bytes, its last the END line's last '-'
		pem := bytes.TrimSuffix(p.certPEM, []byte("\n"))
		return append(bytes.Repeat([]byte("\n"), n-len(pem)), pem...)
	}
	writeFile(t, filepath.Join(dir, "big.pem"), pad(secretcache.DefaultMaxFileSecretSize+1))
	writeFile(t, filepath.Join(dir, "max.pem"), pad(secretcache.DefaultMaxFileSecretSize))
	f := allowIn(t, dir)
	_, err := f.m.Secret(context.Background(), secretcache.FileRootPrefix+filepath.Join(dir, "big.pem"))
	if !errors.Is(err, secretcache.ErrNotReady) || !strings.Contains(err.Error(), "larger than the limit of 1048576 bytes") {
		t.Fatalf("Secret of a file above the limit = %v", err)
	}
	if s := mustSecret(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "max.pem")); !s.Roots[0].Equal(p.cert) {
		t.Fatal("a file at the limit is not served")
	}
	small := newFixture(t, func(c *secretcache.Config) { c.FileSecretDirs = []string{dir}; c.MaxFileSecretSize = 100 })
	if _, err := small.m.Secret(context.Background(), secretcache.FileRootPrefix+filepath.Join(dir, "max.pem")); !errors.Is(err, secretcache.ErrNotReady) {
		t.Fatalf("MaxFileSecretSize 100: %v", err)
	}
}

// The attack: many spellings of one file, and many watches, made entries
// that were never freed, and every event in a directory re-read them all.
// Spellings share one entry; the last cancel frees it and its topic; an
// event re-reads only the files it may have changed.
func TestFileEntriesShareAndFree(t *testing.T) {
	dir := t.TempDir()
	a, b := newPair(t, "a"), newPair(t, "b")
	pathA, pathB := filepath.Join(dir, "a.pem"), filepath.Join(dir, "b.pem")
	writeFile(t, pathA, a.certPEM)
	writeFile(t, pathB, b.certPEM)
	f := allowIn(t, dir)
	topics0, files0 := f.m.Held()
	t.Chdir(dir)

	// The clean spellings of a: absolute, relative, and relative with
	// Istio's "./". Others are refused by name.
	names := []string{
		secretcache.FileRootPrefix + pathA,
		secretcache.FileRootPrefix + "a.pem",
		secretcache.FileRootPrefix + "./a.pem",
	}
	for _, n := range []string{dir + "/./a.pem", dir + "//a.pem", "./b/../a.pem", ".//a.pem"} {
		notFound(t, f.m, secretcache.FileRootPrefix+n)
		notFound(t, f.m, secretcache.FileCertPrefix+pathA+"~"+n)
	}
	var cancels []func()
	chans := map[string]chan *secretcache.Secret{}
	for _, n := range names {
		ch := make(chan *secretcache.Secret, 10)
		chans[n] = ch
		cancels = append(cancels, f.m.Watch(n, func(s *secretcache.Secret) { ch <- s }))
	}
	chB := make(chan *secretcache.Secret, 10)
	cancelB := f.m.Watch(secretcache.FileRootPrefix+pathB, func(s *secretcache.Secret) { chB <- s })
	if topics, files := f.m.Held(); topics-topics0 != 4 || files-files0 != 2 {
		t.Fatalf("held %d topics and %d files for 3 spellings of a and b, want 4 and 2", topics-topics0, files-files0)
	}
	for _, n := range names {
		if s := mustSecret(t, f.m, n); s.Name != n || !s.Roots[0].Equal(a.cert) {
			t.Fatalf("Secret(%q) = %q", n, s.Name)
		}
	}
	mustSecret(t, f.m, secretcache.FileRootPrefix+pathB)
	for _, n := range names { // the first load
		receive(t, chans[n], "first load of a")
	}
	receive(t, chB, "first load of b")
	f.run(t)
	f.logs.WaitForContaining(t, "watching directory", 1)

	// b disappears: one failed reload of b.
	if err := os.Remove(pathB); err != nil {
		t.Fatal(err)
	}
	f.logs.WaitForContaining(t, "file secret not reloaded", 1)
	// Two changes of a: each reaches every spelling, with its own name.
	for i := range 2 {
		next := newPair(t, "a-next")
		writeFile(t, pathA, next.certPEM)
		for _, n := range names {
			if s := receive(t, chans[n], "change of a"); s.Name != n || !s.Roots[0].Equal(next.cert) {
				t.Fatalf("change %d: push to %q is %q", i, n, s.Name)
			}
		}
	}
	// Had the events of a re-read b, it would have failed again.
	if n := f.logs.CountContaining("file secret not reloaded"); n != 1 {
		t.Fatalf("%d failed reloads, want 1 (b only once):\n%s", n, f.logs.All())
	}
	for _, c := range cancels {
		c()
	}
	cancelB()
	if topics, files := f.m.Held(); topics != topics0 || files != files0 {
		t.Fatalf("after the last cancel: %d topics and %d files held, want %d and %d", topics, files, topics0, files0)
	}
	if len(chB) != 0 {
		t.Fatal("b was pushed although it never changed to valid content")
	}

}

// warnOnly passes on records at Warn and above.
type warnOnly struct{ h slog.Handler }

func (w warnOnly) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnOnly) Handle(ctx context.Context, r slog.Record) error {
	return w.h.Handle(ctx, r)
}
func (w warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{w.h.WithAttrs(as)} }
func (w warnOnly) WithGroup(g string) slog.Handler       { return warnOnly{w.h.WithGroup(g)} }

// tee passes each record on to every handler that takes its level.
type tee []slog.Handler

func (t tee) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range t {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}
func (t tee) Handle(ctx context.Context, r slog.Record) error {
	for _, h := range t {
		if h.Enabled(ctx, r.Level) {
			if err := h.Handle(ctx, r.Clone()); err != nil {
				return err
			}
		}
	}
	return nil
}
func (t tee) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(tee, len(t))
	for i, h := range t {
		out[i] = h.WithAttrs(as)
	}
	return out
}
func (t tee) WithGroup(g string) slog.Handler {
	out := make(tee, len(t))
	for i, h := range t {
		out[i] = h.WithGroup(g)
	}
	return out
}

// The attack: names in directories that do not exist, each of which made
// a warning that its directory cannot be watched. No warning for those.
func TestAbsentDirectoriesDoNotFloodTheLog(t *testing.T) {
	dir := t.TempDir()
	warns := testkit.NewLogRecorder()
	f := newFixture(t, func(c *secretcache.Config) {
		c.FileSecretDirs = []string{dir}
		c.Logger = slog.New(tee{c.Logger.Handler(), warnOnly{warns}}) // f.logs gets every record
	})
	f.run(t)
	p := newPair(t, "root")
	writeFile(t, filepath.Join(dir, "root.pem"), p.certPEM)
	for i := range 100 {
		watch(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, fmt.Sprintf("no-such-%d", i), "x.pem"))
	}
	// A watched file that exists is a sync point: its directory is
	// watched after the others were tried.
	ch := watch(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "root.pem"))
	mustSecret(t, f.m, secretcache.FileRootPrefix+filepath.Join(dir, "root.pem"))
	receive(t, ch, "first load")
	// Its directory is the only one watched; the change below would be
	// missed if written before (the watcher may start after Watch).
	f.logs.WaitForContaining(t, "watching directory", 1)
	writeFile(t, filepath.Join(dir, "root.pem"), newPair(t, "next").certPEM)
	receive(t, ch, "change")
	if n := warns.CountContaining("cannot watch directory"); n != 0 {
		t.Fatalf("%d warnings for absent directories:\n%s", n, warns.All())
	}
}
