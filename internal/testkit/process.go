package testkit

import (
	"bufio"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// buildBinary runs the build script scripts/NAME (stamp-checked and cached
// per user) and returns the binary's path, its last line of output.
func buildBinary(t testing.TB, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", name)
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		t.Fatalf("building with %s: %v", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// startProcess starts cmd (a real server binary the test runs), waits for
// marker in its stderr, then until addr accepts connections (some log
// before they bind), each within Guard.
func startProcess(t testing.TB, cmd *exec.Cmd, marker, addr, name string) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{})
	var tail sync.Mutex
	var last []string
	go func() {
		s := bufio.NewScanner(stderr)
		once := sync.Once{}
		for s.Scan() {
			tail.Lock()
			last = append(last[max(0, len(last)-19):], s.Text())
			tail.Unlock()
			if strings.Contains(s.Text(), marker) {
				once.Do(func() { close(listening) })
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(Guard):
		_ = cmd.Process.Kill()
		tail.Lock()
		defer tail.Unlock()
		t.Fatalf("%s did not listen on %s within %v; its last lines:\n%s", name, addr, Guard, strings.Join(last, "\n"))
	}
	deadline := time.Now().Add(Guard)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s: %v", name, addr, err)
		}
		<-time.After(10 * time.Millisecond) // an external process binding, not a step of the code under test
	}
}

// stopProcess kills cmd (nil: nothing) and waits for it.
func stopProcess(cmd *exec.Cmd) {
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}
