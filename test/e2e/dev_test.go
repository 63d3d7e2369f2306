package e2e_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshid/meshid/testkit"
)

// dev is a running `meshid dev`.
type dev struct {
	proc     *proc
	stateDir string
	caAddr   string // the CA's CreateCertificate address
	root     string // <state-dir>/root-cert.pem
	sock     string // <state-dir>/sds.sock

	caMonitor, agentMonitor string // /metrics /healthz /readyz addresses
}

var (
	devCALine           = regexp.MustCompile(`CA \(CreateCertificate, TLS\)\s+(\S+)`)
	devCAMonitorLine    = regexp.MustCompile(`CA metrics/health\s+(\S+)`)
	devAgentMonitorLine = regexp.MustCompile(`agent metrics/health\s+(\S+)`)
	devTryLine          = regexp.MustCompile(`Try: (\S+) inspect --sds `)
)

// startDev runs `meshid dev` on free ports in a fresh state directory and
// waits until its SDS socket serves default and ROOTCA.
func startDev(t *testing.T) *dev {
	t.Helper()
	d := &dev{stateDir: testkit.ShortDir(t)}
	d.proc = startMeshid(t, "dev",
		"--state-dir", d.stateDir,
		"--listen", "127.0.0.1:0",
		"--monitoring-listen", "127.0.0.1:0",
		"--agent-monitoring-listen", "127.0.0.1:0",
	)
	d.caAddr = d.proc.waitLine(t, devCALine)[1]
	d.caMonitor = d.proc.waitLine(t, devCAMonitorLine)[1]
	d.agentMonitor = d.proc.waitLine(t, devAgentMonitorLine)[1]
	// The banner's command names the binary as it was run (bin/meshid
	// under make run), not a "meshid" that may not be on the PATH.
	if try := d.proc.waitLine(t, devTryLine); try[1] != meshidBin {
		t.Fatalf("the banner says Try: %s, want the binary %s", try[1], meshidBin)
	}
	d.root = filepath.Join(d.stateDir, "root-cert.pem")
	d.sock = filepath.Join(d.stateDir, "sds.sock")
	waitSDS(t, d.sock)
	for _, f := range []string{"root-cert.pem", "jwks.json", "token"} {
		if _, err := os.Stat(filepath.Join(d.stateDir, f)); err != nil {
			t.Fatalf("meshid dev did not write %s: %v", f, err)
		}
	}
	return d
}

// token mints a service-account token with `meshid dev token`.
func (d *dev) token(t *testing.T, ns, sa string, extra ...string) string {
	t.Helper()
	args := append([]string{"dev", "token", "--state-dir", d.stateDir, "--namespace", ns, "--service-account", sa}, extra...)
	tok := strings.TrimSpace(mustMeshid(t, args...).stdout)
	if strings.Count(tok, ".") != 2 {
		t.Fatalf("meshid dev token printed %q, want a JWT", tok)
	}
	return tok
}
