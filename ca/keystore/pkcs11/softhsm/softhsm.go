package softhsm

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Modules are the places the SoftHSM2 module is looked for, after
// $MESHID_SOFTHSM_MODULE.
var Modules = []string{
	"/usr/lib/softhsm/libsofthsm2.so",                   // Debian, Ubuntu
	"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",  // Debian multiarch
	"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so", // Debian arm64
	"/usr/lib64/pkcs11/libsofthsm2.so",                  // Fedora
	"/usr/local/lib/softhsm/libsofthsm2.so",             // source build
	"/opt/homebrew/lib/softhsm/libsofthsm2.so",          // Homebrew
}

// Token is one initialised SoftHSM2 token.
type Token struct {
	Module  string // path of libsofthsm2.so
	Label   string // token label
	PIN     string // user PIN
	PINFile string // file holding PIN, for pin-source
	Dir     string // the token directory
}

// Module returns the path of the SoftHSM2 module and softhsm2-util, or
// skips t (fails it under CI=true, and under MESHID_REQUIRE_SOFTHSM=1,
// which `make test` sets) when SoftHSM2 is not installed.
func Module(t testing.TB) (module, util string) {
	t.Helper()
	candidates := Modules
	if m := os.Getenv("MESHID_SOFTHSM_MODULE"); m != "" {
		candidates = []string{m}
	}
	for _, m := range candidates {
		if _, err := os.Stat(m); err == nil {
			module = m
			break
		}
	}
	util, err := exec.LookPath("softhsm2-util")
	if module == "" || err != nil {
		msg := "SoftHSM2 is not installed (need libsofthsm2.so and softhsm2-util): run `make softhsm`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " — CI=true, so the PKCS#11 tests may not be skipped")
		}
		if os.Getenv("MESHID_REQUIRE_SOFTHSM") == "1" {
			t.Fatal(msg + " — MESHID_REQUIRE_SOFTHSM=1 (make test), so the PKCS#11 tests may not be skipped")
		}
		t.Skip(msg)
	}
	return module, util
}

// New initialises a token labelled "meshid" in a temporary directory and
// points SOFTHSM2_CONF at it for the rest of the test (so the test may not
// run in parallel). A module already loaded reads the configuration at its
// next C_Initialize, so every key of the previous test must be closed.
func New(t testing.TB) *Token {
	t.Helper()
	module, util := Module(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	cfg := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n", tokens)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTHSM2_CONF", conf)
	tk := &Token{Module: module, Label: "meshid", PIN: "1234-test-pin", Dir: tokens}
	out, err := exec.Command(util, "--init-token", "--free", "--label", tk.Label, "--pin", tk.PIN, "--so-pin", "5678-test-so-pin").CombinedOutput()
	if err != nil {
		t.Fatalf("softhsm2-util --init-token: %v: %s", err, out)
	}
	tk.PINFile = filepath.Join(dir, "pin")
	if err := os.WriteFile(tk.PINFile, []byte(tk.PIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tk
}

// URI returns the RFC 7512 URI of the key labelled object on the token.
func (tk *Token) URI(object string) string {
	return "pkcs11:token=" + url.PathEscape(tk.Label) + ";object=" + url.PathEscape(object) +
		"?module-path=" + tk.Module + "&pin-source=" + tk.PINFile
}
