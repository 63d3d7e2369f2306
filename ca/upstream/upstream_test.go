package upstream_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshid/meshid/ca/upstream"
)

// TestParseURL: the attacker's URLs (credentials in it, a path, no port,
// an option given twice, a huge value) are refused.
func TestParseURL(t *testing.T) {
	u, err := upstream.ParseURL("cfssl+https://ca.corp:8888?profile=mesh&ca=/etc/ca.pem")
	if err != nil || u.Scheme != "cfssl+https" || u.Host != "ca.corp:8888" || u.Query.Get("profile") != "mesh" {
		t.Fatalf("%+v %v", u, err)
	}
	for raw, want := range map[string]string{
		"cfssl+https://user:pw@ca:1?profile=p":   "credentials",
		"cfssl+https://ca:1/api?profile=p":       "no path",
		"cfssl+https://ca?profile=p":             "port",
		"cfssl+https://ca:1?profile=a&profile=b": "2 times",
		"ca:1":                                   "SCHEME://",
		"cfssl+https://ca:1?p=" + strings.Repeat("x", upstream.MaxURLLength): "more than",
	} {
		if _, err := upstream.ParseURL(raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: %v, want %q", raw, err, want)
		}
	}
}

// TestReadHexKey: the credentials file's limits, and no error quotes it.
func TestReadHexKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, perm os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), perm); err != nil || os.Chmod(p, perm) != nil { // Chmod: past the umask
			t.Fatal(err)
		}
		return p
	}
	good := strings.Repeat("0a", 16)
	if k, err := upstream.ReadHexKey(write("secretvol", good, 0o440), 16); err != nil || len(k) != 16 {
		t.Fatalf("a Secret volume's 0440 file: %v", err)
	}
	if k, err := upstream.ReadHexKey(write("good", good+"\n", 0o600), 16); err != nil || len(k) != 16 {
		t.Fatalf("%d bytes, %v", len(k), err)
	}
	link := filepath.Join(dir, "link") // a mounted Secret's file is a symbolic link
	if err := os.Symlink(filepath.Join(dir, "good"), link); err != nil {
		t.Fatal(err)
	}
	if _, err := upstream.ReadHexKey(link, 16); err != nil {
		t.Fatalf("through a symbolic link: %v", err)
	}
	secret := "zz" + strings.Repeat("41", 20)
	for name, tc := range map[string]struct {
		path, want string
	}{
		"readable by others": {write("loose", good, 0o604), "mode"},
		"group may write":    {write("groupw", good, 0o660), "mode"},
		"not hex":            {write("nothex", secret, 0o600), "not a key in hex"},
		"short":              {write("short", "0a0b", 0o600), "at least 16"},
		"huge":               {write("huge", strings.Repeat("0", upstream.MaxCredentialsSize+2), 0o600), "more than"},
		"directory":          {dir, "not a regular file"},
		"missing":            {filepath.Join(dir, "nope"), "no such file"},
	} {
		_, err := upstream.ReadHexKey(tc.path, 16)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "4141") {
			t.Errorf("%s: the error quotes the file: %v", name, err)
		}
	}
}
