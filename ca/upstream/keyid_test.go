package upstream_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/upstream"
)

// TestReadKeyID: the file naming an intermediate's module key is read
// back; an attacker's (huge, writable by others, a symbolic link, garbage,
// an id too long, a second record) is refused with an error naming the
// file and never its content.
func TestReadKeyID(t *testing.T) {
	dir := t.TempDir()
	id := bytes.Repeat([]byte{0xab}, upstream.KeyIDSize)
	good := filepath.Join(dir, upstream.KeyIDFile)
	if err := os.WriteFile(good, upstream.EncodeKeyID(id), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := upstream.ReadKeyID(good); err != nil || !bytes.Equal(got, id) {
		t.Fatalf("%x, %v", got, err)
	}
	if err := os.Symlink(good, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for path, want := range map[string]string{
		write("huge", append(upstream.EncodeKeyID(id), bytes.Repeat([]byte(" "), upstream.MaxKeyIDFileSize)...), 0o600): "more than",
		write("writable", upstream.EncodeKeyID(id), 0o666):                                                              "lets others write",
		filepath.Join(dir, "link"): "not a regular file",
		write("garbage", []byte("-----BEGIN EC PRIVATE KEY-----\nsecret\n"), 0o600):  "not one",
		write("extra", []byte(`{"pkcs11_id":"ab","pin":"1234"}`), 0o600):             "not one",
		write("two", []byte(`{"pkcs11_id":"ab"}{"pkcs11_id":"cd"}`), 0o600):          "not one",
		write("long", []byte(`{"pkcs11_id":"`+strings.Repeat("ab", 65)+`"}`), 0o600): "1 to 64 bytes",
		write("empty", []byte(`{"pkcs11_id":""}`), 0o600):                            "1 to 64 bytes",
		write("nothex", []byte(`{"pkcs11_id":"zz"}`), 0o600):                         "1 to 64 bytes",
		filepath.Join(dir, "absent"):                                                 "no such file",
	} {
		_, err := upstream.ReadKeyID(path)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", filepath.Base(path), err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "1234")) {
			t.Errorf("%s: the error quotes the file: %v", filepath.Base(path), err)
		}
	}
}
