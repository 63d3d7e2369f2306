package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/meshid/meshid/testkit"
)

// readmeJourneys are the README sections whose shell blocks run against a
// started `meshid dev` (make run), as a new user types them.
var readmeJourneys = []string{"## Journey 1: a proxy over SDS", "## Journey 2: a workload over the SPIFFE Workload API"}

// TestREADMEJourneys runs the shell commands of the README's journeys, as
// written, in a directory where bin/meshid and bin/meshid-agent are the
// built binaries and .meshid-dev is the state directory of a running
// `meshid dev` (its CA address put in place of 127.0.0.1:15012). Each
// command must exit 0; a trailing comment naming a SPIFFE ID must be in its
// output; a command ending in & is started in the background and its
// --sds-socket waited for.
func TestREADMEJourneys(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, section := range readmeJourneys {
		body := sectionOf(t, string(readme), section)
		blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(body, -1)
		if len(blocks) == 0 {
			t.Fatalf("README %q has no sh block", section)
		}
		for _, b := range blocks {
			cmds = append(cmds, commands(b[1])...)
		}
	}

	d := startDev(t)
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	agentBin := filepath.Join(work, "bin", "meshid-agent")
	if out, err := exec.Command("go", "build", "-o", agentBin, "github.com/meshid/meshid/cmd/meshid-agent").CombinedOutput(); err != nil {
		t.Fatalf("building meshid-agent: %v\n%s", err, out)
	}
	for _, link := range [][2]string{{meshidBin, "bin/meshid"}, {d.stateDir, ".meshid-dev"}} {
		if err := os.Symlink(link[0], filepath.Join(work, link[1])); err != nil {
			t.Fatal(err)
		}
	}
	socketFlag := regexp.MustCompile(`--sds-socket (\S+)`)
	wantID := regexp.MustCompile(`#\s*(spiffe://\S+)`)
	for _, c := range cmds {
		c = strings.ReplaceAll(c, "127.0.0.1:15012", d.caAddr)
		if bg, ok := strings.CutSuffix(c, "&"); ok {
			cmd := exec.Command("bash", "-c", "exec "+bg)
			cmd.Dir = work
			if err := cmd.Start(); err != nil {
				t.Fatalf("%s: %v", c, err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			if m := socketFlag.FindStringSubmatch(bg); m != nil {
				testkit.Until(t, "the socket of `"+bg+"`", func() bool {
					fi, err := os.Stat(filepath.Join(work, m[1]))
					return err == nil && fi.Mode()&os.ModeSocket != 0
				})
			}
			continue
		}
		cmd := exec.Command("bash", "-c", c)
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("README command failed: %s\n%v\n%s", c, err, out)
		}
		if m := wantID.FindStringSubmatch(c); m != nil && !strings.Contains(string(out), m[1]) {
			t.Errorf("README command: %s\nits output lacks %s:\n%s", c, m[1], out)
		}
	}
	if len(cmds) < 5 {
		t.Fatalf("ran %d README commands, want the journeys' (at least 5)", len(cmds))
	}
}

// sectionOf is the README text from heading to the next "## " heading.
func sectionOf(t *testing.T, readme, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// commands splits a shell block into commands: backslash continuations
// joined, blank lines dropped.
func commands(block string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(block, "\n") {
		if strings.TrimSpace(line) == "" && cur.Len() == 0 {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	return out
}
