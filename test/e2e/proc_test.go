package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// proc is a long-running meshid child process whose output lines the test
// can wait for.
type proc struct {
	name string
	cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced when a line arrives

	exited  chan struct{} // closed when the process has exited
	waitErr error         // set before exited is closed
}

// startMeshid starts `meshid args...`. The process is interrupted (SIGINT,
// then killed if it lingers) when the test ends, and must then exit 0.
func startMeshid(t *testing.T, args ...string) *proc {
	t.Helper()
	return startMeshidEnv(t, nil, args...)
}

// startMeshidEnv is startMeshid with env (NAME=value) added to the
// process's environment.
func startMeshidEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{
		name:    "meshid " + args[0],
		cmd:     exec.Command(meshidBin, args...),
		changed: make(chan struct{}),
		exited:  make(chan struct{}),
	}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	var readers sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			p.scan(r)
		}()
	}
	go func() {
		// Wait must follow the readers: it closes the pipes.
		readers.Wait()
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *proc) scan(r io.Reader) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		p.mu.Lock()
		p.lines = append(p.lines, s.Text())
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
}

// output returns everything the process printed so far.
func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLine waits until a line of output matches re and returns its
// submatches. It fails the test if the process exits first or nothing
// matches within the guard time.
func (p *proc) waitLine(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.NewTimer(guard)
	defer deadline.Stop()
	seen := 0
	for {
		p.mu.Lock()
		lines, changed := p.lines[seen:], p.changed
		p.mu.Unlock()
		for _, l := range lines {
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		}
		seen += len(lines)
		select {
		case <-changed:
		case <-p.exited:
			// Lines printed just before the exit may still be unread.
			p.mu.Lock()
			rest := p.lines[seen:]
			p.mu.Unlock()
			for _, l := range rest {
				if m := re.FindStringSubmatch(l); m != nil {
					return m
				}
			}
			t.Fatalf("%s exited (%v) before printing a line matching %q; output:\n%s", p.name, p.waitErr, re, p.output())
		case <-deadline.C:
			t.Fatalf("%s printed no line matching %q within %v; output:\n%s", p.name, re, guard, p.output())
		}
	}
}

// stop interrupts the process as Ctrl-C would and checks that it exits 0.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		t.Errorf("%s exited early (%v); output:\n%s", p.name, p.waitErr, p.output())
		return
	default:
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	grace := time.NewTimer(guard)
	defer grace.Stop()
	select {
	case <-p.exited:
	case <-grace.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s did not stop within %v of SIGINT; output:\n%s", p.name, guard, p.output())
		return
	}
	if p.waitErr != nil {
		t.Errorf("%s after SIGINT: %v; output:\n%s", p.name, p.waitErr, p.output())
	}
}

// result is the outcome of a one-shot meshid command.
type result struct {
	stdout, stderr string
	code           int
}

// runMeshid runs `meshid args...` to completion with stdin (may be nil).
func runMeshid(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshidBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		res.code = exit.ExitCode()
	default:
		t.Fatalf("meshid %s: %v; stderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return res
}

// mustMeshid runs `meshid args...` and fails the test unless it exits 0.
func mustMeshid(t *testing.T, args ...string) result {
	t.Helper()
	res := runMeshid(t, nil, args...)
	if res.code != 0 {
		t.Fatalf("meshid %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res
}
