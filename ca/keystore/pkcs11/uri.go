package pkcs11

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// Limits on a URI, so that a bad flag value fails fast with a clear error.
const (
	// MaxURILength bounds a whole URI (a module path is at most PATH_MAX,
	// 4096, the rest is short).
	MaxURILength = 8192
	// MaxLabelLength bounds the object label and the id. (PKCS#11 token
	// labels are at most 32 bytes.)
	MaxLabelLength = 256
	maxTokenLabel  = 32
	// MaxPINLength bounds the PIN read from pin-source.
	MaxPINLength = 256
)

// Scheme is the prefix of a PKCS#11 URI.
const Scheme = "pkcs11:"

// URI is a parsed RFC 7512 URI naming one private key. Only what meshid
// needs is accepted:
//   - path: token (label) or serial to select the token, object (label)
//     and/or id to select the key, and optionally type=private;
//   - query: module-path (an absolute path to the module's .so) and
//     pin-source (an absolute path, or a file: URI, to a file holding the
//     user PIN).
//
// Everything else is refused: pin-value (it would put the PIN in a command
// line), module-name (meshid does not search library directories), slot
// attributes and unknown or repeated attributes.
type URI struct {
	Token      string // token label
	Serial     string // token serial number
	Object     string // key label (CKA_LABEL)
	ID         []byte // key id (CKA_ID)
	ModulePath string
	PINSource  string // absolute, clean path
}

// IsURI reports whether s is meant as a PKCS#11 URI (and not a file path).
func IsURI(s string) bool { return strings.HasPrefix(s, Scheme) }

// ParseURI parses and validates a PKCS#11 URI. It does not touch the file
// system; Open checks the module and PIN files.
func ParseURI(s string) (*URI, error) {
	if len(s) > MaxURILength {
		return nil, fmt.Errorf("pkcs11: URI of %d bytes is longer than %d", len(s), MaxURILength)
	}
	if !IsURI(s) {
		return nil, errors.New(`pkcs11: URI must start with "pkcs11:"`)
	}
	rest := s[len(Scheme):]
	path, query, _ := strings.Cut(rest, "?")
	if i := strings.IndexByte(query, '#'); i >= 0 || strings.IndexByte(path, '#') >= 0 {
		return nil, errors.New("pkcs11: URI must not have a fragment")
	}
	u := &URI{}
	seen := map[string]bool{}
	attrs := func(part, sep, where string, set func(name, value string) error) error {
		if part == "" {
			return nil
		}
		for _, kv := range strings.Split(part, sep) {
			name, raw, ok := strings.Cut(kv, "=")
			if !ok || name == "" {
				return fmt.Errorf("pkcs11: %s attribute %q is not name=value", where, clip(kv))
			}
			if seen[name] {
				return fmt.Errorf("pkcs11: attribute %q given twice", clip(name))
			}
			seen[name] = true
			// Split first, then decode: %3B and %26 are literal ; and &.
			value, err := url.PathUnescape(raw)
			if err != nil {
				return fmt.Errorf("pkcs11: attribute %q: bad percent-encoding", clip(name))
			}
			if err := set(name, value); err != nil {
				return err
			}
		}
		return nil
	}
	err := attrs(path, ";", "path", func(name, v string) error {
		switch name {
		case "token":
			return text(&u.Token, name, v, maxTokenLabel)
		case "serial":
			return text(&u.Serial, name, v, maxTokenLabel)
		case "object":
			return text(&u.Object, name, v, MaxLabelLength)
		case "id":
			if len(v) == 0 || len(v) > MaxLabelLength {
				return fmt.Errorf("pkcs11: id must be 1 to %d bytes", MaxLabelLength)
			}
			u.ID = []byte(v)
			return nil
		case "type":
			if v != "private" {
				return fmt.Errorf("pkcs11: type=%q: meshid needs the private key (type=private)", clip(v))
			}
			return nil
		case "manufacturer", "model", "library-manufacturer", "library-description", "library-version", "slot-manufacturer", "slot-description", "slot-id":
			return fmt.Errorf("pkcs11: attribute %q is not supported; select the token by token= or serial=", name)
		}
		return fmt.Errorf("pkcs11: unknown path attribute %q", clip(name))
	})
	if err != nil {
		return nil, err
	}
	err = attrs(query, "&", "query", func(name, v string) error {
		switch name {
		case "module-path":
			p, err := absPath(name, v)
			u.ModulePath = p
			return err
		case "pin-source":
			if rest, ok := strings.CutPrefix(v, "file://"); ok {
				v = rest
			} else if rest, ok := strings.CutPrefix(v, "file:"); ok {
				v = rest
			}
			p, err := absPath(name, v)
			u.PINSource = p
			return err
		case "pin-value":
			return errors.New("pkcs11: pin-value would put the PIN in the command line and logs; put it in a file and use pin-source")
		case "module-name":
			return errors.New("pkcs11: module-name is not supported; give the module's absolute module-path")
		}
		return fmt.Errorf("pkcs11: unknown query attribute %q", clip(name))
	})
	if err != nil {
		return nil, err
	}
	switch {
	case u.Token == "" && u.Serial == "":
		return nil, errors.New("pkcs11: URI names no token (want token=<label> or serial=<serial>)")
	case u.Token != "" && u.Serial != "":
		return nil, errors.New("pkcs11: give token= or serial=, not both")
	case u.Object == "" && len(u.ID) == 0:
		return nil, errors.New("pkcs11: URI names no key (want object=<label> and/or id=<id>)")
	case u.ModulePath == "":
		return nil, errors.New("pkcs11: URI names no module (want ?module-path=/path/to/module.so)")
	case u.PINSource == "":
		return nil, errors.New("pkcs11: URI names no PIN file (want &pin-source=/path/to/pin-file)")
	}
	return u, nil
}

// String returns the URI in canonical form. It holds no secret: the PIN is
// only ever in the pin-source file.
func (u *URI) String() string {
	var path []string
	if u.Token != "" {
		path = append(path, "token="+escape(u.Token))
	}
	if u.Serial != "" {
		path = append(path, "serial="+escape(u.Serial))
	}
	if u.Object != "" {
		path = append(path, "object="+escape(u.Object))
	}
	if len(u.ID) > 0 {
		path = append(path, "id="+escape(string(u.ID)))
	}
	return Scheme + strings.Join(path, ";") + "?module-path=" + escape(u.ModulePath) + "&pin-source=" + escape(u.PINSource)
}

func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~/:", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// text sets a string attribute: UTF-8, no control characters (labels are
// passed to C and echoed in errors), at most max bytes.
func text(dst *string, name, v string, max int) error {
	if v == "" || len(v) > max {
		return fmt.Errorf("pkcs11: %s must be 1 to %d bytes", name, max)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("pkcs11: %s is not UTF-8", name)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("pkcs11: %s contains a control character", name)
		}
	}
	*dst = v
	return nil
}

// absPath requires an absolute, clean path (no "..", no "//"), so what the
// operator reads in the flag is the file that is opened.
func absPath(name, p string) (string, error) {
	if p == "" || len(p) > 4096 {
		return "", fmt.Errorf("pkcs11: %s must be an absolute path of at most 4096 bytes", name)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("pkcs11: %s contains a NUL byte", name)
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", fmt.Errorf("pkcs11: %s %q must be an absolute, clean path (no .. or //)", name, clip(p))
	}
	return p, nil
}

// clip shortens attacker-sized input before it goes into an error message.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// ReadPIN reads the user PIN from path: a regular file (symbolic links are
// followed, as in a Kubernetes Secret volume) of at most MaxPINLength bytes;
// one trailing newline is dropped. A FIFO, a device (/dev/zero) or a
// directory is refused before it is read, and errors never contain the
// file's content.
func ReadPIN(path string) (string, error) {
	if _, err := absPath("pin-source", path); err != nil {
		return "", err
	}
	// O_NONBLOCK: opening a FIFO must not block before the check below.
	f, err := os.OpenFile(path, os.O_RDONLY|nonblock, 0)
	if err != nil {
		return "", fmt.Errorf("pkcs11: PIN file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("pkcs11: PIN file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("pkcs11: PIN file %s is not a regular file", path)
	}
	if st.Size() > MaxPINLength+2 {
		return "", fmt.Errorf("pkcs11: PIN file %s is larger than %d bytes", path, MaxPINLength)
	}
	buf := make([]byte, MaxPINLength+3)
	n, _ := f.Read(buf) // a regular file of this size is read at once
	pin := strings.TrimSuffix(strings.TrimSuffix(string(buf[:n]), "\n"), "\r")
	switch {
	case n > MaxPINLength+2 || len(pin) > MaxPINLength:
		return "", fmt.Errorf("pkcs11: PIN file %s is larger than %d bytes", path, MaxPINLength)
	case pin == "":
		return "", fmt.Errorf("pkcs11: PIN file %s is empty", path)
	case strings.ContainsAny(pin, "\x00\n"):
		return "", fmt.Errorf("pkcs11: PIN file %s holds more than one line", path)
	}
	return pin, nil
}

// checkModule refuses a module path that is not a regular file, or that a
// group or other users may write: dlopen runs the module's code inside the
// CA, with the CA key's custody at stake.
func checkModule(path string) error {
	if _, err := absPath("module-path", path); err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("pkcs11: module: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("pkcs11: module %s is not a regular file", path)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("pkcs11: module %s is writable by group or others (mode %#o); refusing to load it", path, st.Mode().Perm())
	}
	return nil
}

// ParseOptionalURI is a key that may live in a module: nil for "" (a key
// file), else the parsed PKCS#11 URI; any other string is refused.
func ParseOptionalURI(s string) (*URI, error) {
	switch {
	case s == "":
		return nil, nil
	case IsURI(s):
		return ParseURI(s)
	}
	return nil, fmt.Errorf("%q: want a pkcs11: URI", clip(s))
}
