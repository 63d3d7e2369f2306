package inspect_test

import (
	"bytes"
	"crypto/x509"
	"regexp"
	"strings"
	"testing"

	"github.com/meshid/meshid/inspect"
)

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// TestTableTerminal: for a terminal the table is narrower (no NOT BEFORE)
// with VALID in colour, and the columns still line up once the colour
// codes are taken out; for anything else it is plain.
func TestTableTerminal(t *testing.T) {
	m := newMesh(t)
	bad := newMesh(t) // a leaf of another CA: invalid against m's root
	rep := inspect.Check([]*inspect.Input{
		chainInput("good.pem", m.leaf, m.inter.cert),
		chainInput("foreign-with-a-long-name.pem", bad.leaf, bad.inter.cert),
	}, inspect.Options{Now: now, Roots: []*x509.Certificate{m.root.cert}, RootsName: "roots.pem"})

	var plain, tty bytes.Buffer
	if err := inspect.WriteTable(&plain, rep, false); err != nil {
		t.Fatal(err)
	}
	if err := inspect.WriteTableStyle(&tty, rep, inspect.TableStyle{Terminal: true}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "\x1b") || !strings.Contains(plain.String(), "NOT BEFORE") {
		t.Fatalf("plain table:\n%s", plain.String())
	}
	out := tty.String()
	if !strings.Contains(out, "\x1b[32mtrue\x1b[0m") || !strings.Contains(out, "\x1b[31mfalse\x1b[0m") || strings.Contains(out, "NOT BEFORE") {
		t.Fatalf("terminal table:\n%q", out)
	}
	lines := strings.Split(ansi.ReplaceAllString(out, ""), "\n")[:3]
	header := lines[0]
	for _, col := range []string{"TYPE", "VALID", "SPIFFE ID", "NOT AFTER"} {
		at := strings.Index(header, col)
		for _, l := range lines[1:] {
			if at > 0 && l[at-1] != ' ' || l[at] == ' ' {
				t.Fatalf("column %s is not aligned:\n%s", col, strings.Join(lines, "\n"))
			}
		}
	}
	if w := len(lines[1]); w >= len(strings.Split(plain.String(), "\n")[1]) {
		t.Fatalf("terminal row is %d wide, not narrower than the plain one", w)
	}
}
