package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one child binary whose output goes to a log file.
type Process struct {
	name    string
	path    string
	args    []string
	logPath string
	env     []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the running process has exited
	err  error         // its exit status, valid after done
}

// StartProcess starts binary path with args; its output is appended to
// logPath. Stop it with Stop (tests: in t.Cleanup).
func StartProcess(name, path, logPath string, env []string, args ...string) (*Process, error) {
	p := &Process{name: name, path: path, args: args, logPath: logPath, env: env}
	if err := p.start(); err != nil {
		return nil, err
	}
	return p, nil
}

// start launches the process. The child gets SIGKILL if the test binary
// dies (Pdeathsig), so a crashed or timed-out test leaks no API server.
func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done: // exited on its own; may be started again
		default:
			return fmt.Errorf("harness: %s already running", p.name)
		}
	}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("harness: %s log: %w", p.name, err)
	}
	cmd := exec.Command(p.path, p.args...)
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Pdeathsig fires when the forking OS thread exits; keep this goroutine
	// on its thread while forking (the runtime does not retire it after).
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		logFile.Close()
		return fmt.Errorf("harness: start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		werr := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.err = werr
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Exited returns a channel closed when the current process exits, or nil
// if none was started (or it was stopped).
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Stop sends SIGTERM, then SIGKILL after grace, and waits for the exit. A
// non-zero exit status is not an error (SIGTERM may cause one); a failure to
// wait is.
func (p *Process) Stop(grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd, p.done = nil, nil
	var exitErr *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exitErr) {
		return fmt.Errorf("harness: %s: %w", p.name, p.err)
	}
	return nil
}

// Running reports whether the process was started and has not exited.
func (p *Process) Running() bool {
	done := p.Exited()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Tail returns the last n bytes of the process log, for failure messages.
func (p *Process) Tail(n int64) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	return string(buf)
}

// CPUTime returns the CPU time (user + system) the running process has used
// so far, from /proc/<pid>/stat: how benchmarks report the API server's
// cost.
func (p *Process) CPUTime() (time.Duration, error) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return 0, fmt.Errorf("harness: %s not started", p.name)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("harness: %s: %w", p.name, err)
	}
	// The command name (field 2) may hold spaces; fields count from the
	// closing parenthesis. utime and stime are fields 14 and 15, in clock
	// ticks of 1/100 s on Linux.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("harness: %s: unexpected /proc stat", p.name)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("harness: %s: unexpected /proc stat", p.name)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("harness: %s: %w", p.name, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// PID is the running process's id, or 0 before it starts.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}
