package pkcs11_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshid/meshid/ca/keystore/pkcs11"
)

func TestParseURI(t *testing.T) {
	tests := []struct {
		in   string
		want pkcs11.URI
	}{
		{
			in:   "pkcs11:token=meshid;object=ca-key?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=/etc/meshid/pin",
			want: pkcs11.URI{Token: "meshid", Object: "ca-key", ModulePath: "/usr/lib/softhsm/libsofthsm2.so", PINSource: "/etc/meshid/pin"},
		},
		{ // percent-encoding, id bytes, type=private, file: pin-source, serial
			in:   "pkcs11:serial=DECC0401648;object=my%20key%3Bv2;id=%01%02%FF;type=private?pin-source=file:///run/pin&module-path=/lib/p11.so",
			want: pkcs11.URI{Serial: "DECC0401648", Object: "my key;v2", ID: []byte{1, 2, 0xff}, ModulePath: "/lib/p11.so", PINSource: "/run/pin"},
		},
		{ // id only
			in:   "pkcs11:token=t;id=%AB?module-path=/m.so&pin-source=file:/p",
			want: pkcs11.URI{Token: "t", ID: []byte{0xab}, ModulePath: "/m.so", PINSource: "/p"},
		},
	}
	for _, tc := range tests {
		u, err := pkcs11.ParseURI(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if u.Token != tc.want.Token || u.Serial != tc.want.Serial || u.Object != tc.want.Object ||
			!bytes.Equal(u.ID, tc.want.ID) || u.ModulePath != tc.want.ModulePath || u.PINSource != tc.want.PINSource {
			t.Fatalf("%s:\n got %+v\nwant %+v", tc.in, *u, tc.want)
		}
		// String round-trips.
		again, err := pkcs11.ParseURI(u.String())
		if err != nil || again.String() != u.String() || !bytes.Equal(again.ID, u.ID) || again.Object != u.Object {
			t.Fatalf("round trip of %s: %v %v", u, again, err)
		}
	}
}

// TestParseURIRejects is the attacker's list: every bad URI is refused
// with a message that says why, and none echoes a long value in full.
func TestParseURIRejects(t *testing.T) {
	const ok = "?module-path=/m.so&pin-source=/pin"
	huge := strings.Repeat("a", 100_000)
	tests := []struct{ in, want string }{
		{"", `must start with "pkcs11:"`},
		{"/etc/meshid/ca-key.pem", `must start with "pkcs11:"`},
		{"pkcs11:" + huge, "longer than"},
		{"pkcs11:token=t;object=" + strings.Repeat("x", 300) + ok, "object must be 1 to 256 bytes"},
		{"pkcs11:token=" + strings.Repeat("x", 33) + ";object=k" + ok, "token must be 1 to 32 bytes"},
		{"pkcs11:token=t;id=" + strings.Repeat("%00", 257) + ok, "id must be"},
		{"pkcs11:object=k" + ok, "names no token"},
		{"pkcs11:token=t;serial=s;object=k" + ok, "not both"},
		{"pkcs11:token=t" + ok, "names no key"},
		{"pkcs11:token=t;object=k?pin-source=/pin", "names no module"},
		{"pkcs11:token=t;object=k?module-path=/m.so", "names no PIN file"},
		{"pkcs11:token=t;object=k?module-path=/m.so&pin-value=1234", "use pin-source"},
		{"pkcs11:token=t;object=k?module-name=softhsm2&pin-source=/pin", "module-name is not supported"},
		{"pkcs11:token=t;object=k;object=j" + ok, "given twice"},
		{"pkcs11:token=t;object=k?module-path=/m.so&module-path=/evil.so&pin-source=/pin", "given twice"},
		{"pkcs11:token=t;object=k;slot-id=1" + ok, "not supported"},
		{"pkcs11:token=t;object=k;x-vendor=1" + ok, "unknown path attribute"},
		{"pkcs11:token=t;object=k" + ok + "&foo=bar", "unknown query attribute"},
		{"pkcs11:token=t;object=k;type=secret-key" + ok, "type=private"},
		{"pkcs11:token=t;object" + ok, "not name=value"},
		{"pkcs11:token=t;object=%zz" + ok, "bad percent-encoding"},
		{"pkcs11:token=t;object=a%00b" + ok, "control character"},
		{"pkcs11:token=t;object=a%0Ab" + ok, "control character"},
		{"pkcs11:token=t;object=%FF%FE" + ok, "not UTF-8"},
		{"pkcs11:token=t;object=k#frag" + ok, "fragment"},
		{"pkcs11:token=t;object=k?module-path=m.so&pin-source=/pin", "absolute, clean path"},
		{"pkcs11:token=t;object=k?module-path=/m.so&pin-source=pin", "absolute, clean path"},
		{"pkcs11:token=t;object=k?module-path=/m.so&pin-source=/run/secrets/../../etc/shadow", "absolute, clean path"},
		{"pkcs11:token=t;object=k?module-path=/m.so&pin-source=file://../etc/shadow", "absolute, clean path"},
		{"pkcs11:token=t;object=k?module-path=/usr/lib//m.so&pin-source=/pin", "absolute, clean path"},
		{"pkcs11:token=t;object=k?module-path=/m.so%00.txt&pin-source=/pin", "NUL"},
		{"pkcs11:token=t;object=k?module-path=/" + strings.Repeat("d", 5000) + "&pin-source=/pin", "at most 4096"},
	}
	for _, tc := range tests {
		u, err := pkcs11.ParseURI(tc.in)
		if err == nil {
			t.Errorf("%.80q: accepted as %v", tc.in, u)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.80q: err = %v, want one containing %q", tc.in, err, tc.want)
		}
		if len(err.Error()) > 300 {
			t.Errorf("%.80q: error of %d bytes echoes the input", tc.in, len(err.Error()))
		}
	}
}

func TestReadPIN(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for data, want := range map[string]string{"1234": "1234", "1234\n": "1234", "12 34\r\n": "12 34", strings.Repeat("p", 256) + "\n": strings.Repeat("p", 256)} {
		got, err := pkcs11.ReadPIN(write("pin", data))
		if err != nil || got != want {
			t.Errorf("ReadPIN(%q) = %q, %v; want %q", data, got, err, want)
		}
	}
	// A Kubernetes Secret volume: the file is a symbolic link.
	target := write("target", "4321\n")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if got, err := pkcs11.ReadPIN(link); err != nil || got != "4321" {
		t.Errorf("through a symlink: %q %v", got, err)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	secret := "s3cret-content-never-echoed"
	tests := []struct{ path, want string }{
		{"/dev/zero", "not a regular file"},
		{fifo, "not a regular file"}, // must not block: opened O_NONBLOCK
		{dir, "not a regular file"},
		{write("big", strings.Repeat("x", 10_000)), "larger than 256"},
		{write("257", strings.Repeat("x", 257)), "larger than 256"},
		{write("empty", ""), "empty"},
		{write("two-lines", secret+"\n"+secret+"\n"), "more than one line"},
		{filepath.Join(dir, "absent"), "no such file"},
		{"relative/pin", "absolute"},
		{dir + "/../x", "absolute, clean"},
	}
	for _, tc := range tests {
		_, err := pkcs11.ReadPIN(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadPIN(%s): err = %v, want one containing %q", tc.path, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("ReadPIN(%s): error echoes the file: %v", tc.path, err)
		}
	}
}

func TestIsURI(t *testing.T) {
	if !pkcs11.IsURI("pkcs11:token=t") || pkcs11.IsURI("/etc/ca-key.pem") || pkcs11.IsURI("PKCS11:") {
		t.Fatal("IsURI")
	}
}

func TestParseOptionalURI(t *testing.T) {
	if u, err := pkcs11.ParseOptionalURI(""); u != nil || err != nil {
		t.Fatalf("empty: %v %v", u, err)
	}
	u, err := pkcs11.ParseOptionalURI("pkcs11:token=meshid;object=ca?module-path=/m.so&pin-source=/pin")
	if err != nil || u == nil || u.String() == "" {
		t.Fatalf("URI: %v %v", u, err)
	}
	for _, bad := range []string{"/etc/ca-key.pem", "PKCS11:token=t", "pkcs11:token=t?module-path=relative", strings.Repeat("x", 1<<16)} {
		if u, err := pkcs11.ParseOptionalURI(bad); u != nil || err == nil || len(err.Error()) > 300 {
			t.Errorf("%.40q: %v %.300v", bad, u, err)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	f.Add("pkcs11:token=meshid;object=ca?module-path=/m.so&pin-source=/pin")
	f.Add("pkcs11:serial=1;id=%01%02;type=private?pin-source=file:///p&module-path=/m")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := pkcs11.ParseURI(s)
		if err != nil {
			return
		}
		again, err := pkcs11.ParseURI(u.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", u.String(), s, err)
		}
		if again.String() != u.String() {
			t.Fatalf("not stable: %q -> %q", u.String(), again.String())
		}
	})
}
