//go:build cgo

package pkcs11_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	miekg "github.com/miekg/pkcs11"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/keystore/pkcs11/softhsm"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

func mustURI(t testing.TB, s string) *pkcs11.URI {
	t.Helper()
	u, err := pkcs11.ParseURI(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// generate creates a key in the token through the module and closes it
// with the test.
func generate(t testing.TB, tk *softhsm.Token, object string, kt certs.KeyType) *pkcs11.Key {
	t.Helper()
	k, err := pkcs11.Generate(pkcs11.Config{URI: mustURI(t, tk.URI(object))}, kt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// hsmAuthority is a real ca.Authority whose self-signed root key is in the
// module; the root certificate is kept in a state directory.
func hsmAuthority(t testing.TB, key *pkcs11.Key) (*ca.Authority, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: dir, TrustDomain: td.Name(), Key: key})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return a, dir
}

func signLeaf(t testing.TB, a *ca.Authority) (*ca.Issued, error) {
	t.Helper()
	id := spiffeid.RequireFromPath(td, "/ns/default/sa/web")
	csr, err := ca.VerifyCSR(testkit.CSR(t, testkit.Key(t, certs.ECP256), id))
	if err != nil {
		t.Fatal(err)
	}
	return a.Sign(context.Background(), ca.Request{CSR: csr, ID: id, Caller: "default/web (test)"})
}

func verifyLeaf(t testing.TB, iss *ca.Issued) {
	t.Helper()
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range iss.Roots {
		roots.AddCert(r)
	}
	for _, c := range iss.Chain {
		inter.AddCert(c)
	}
	if _, err := iss.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf signed in the module does not verify: %v", err)
	}
}

func TestSignLeafWithModuleKey(t *testing.T) {
	for _, kt := range []certs.KeyType{certs.ECP256, certs.RSA2048} {
		t.Run(string(kt), func(t *testing.T) {
			tk := softhsm.New(t)
			key := generate(t, tk, "ca", kt)
			a, dir := hsmAuthority(t, key)
			iss, err := signLeaf(t, a)
			if err != nil {
				t.Fatal(err)
			}
			verifyLeaf(t, iss)
			if got := certs.KeyTypeOf(iss.Roots[0].PublicKey); got != string(kt) {
				t.Errorf("root key type %s, want %s", got, kt)
			}
			// No key file ever reaches the state directory.
			if _, err := os.Stat(filepath.Join(dir, keystore.CAKeyFile)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("ca-key.pem written for a module key: %v", err)
			}

			// Restart: New finds the same key, and the state directory
			// gives back the same root.
			key.Close()
			again, err := pkcs11.New(pkcs11.Config{URI: mustURI(t, tk.URI("ca"))})
			if err != nil {
				t.Fatal(err)
			}
			defer again.Close()
			b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: dir, TrustDomain: td.Name(), Key: again})
			if err != nil {
				t.Fatal(err)
			}
			if !b.Cert.Equal(iss.Roots[0]) {
				t.Fatal("restart with the module key made a new root")
			}
			b2, err := keystore.LoadDirSigner(dir, again, b.Cert.NotBefore.Add(1))
			if err != nil || !b2.Cert.Equal(b.Cert) {
				t.Fatalf("LoadDirSigner: %v", err)
			}
		})
	}
}

// TestModuleKeyNotExportable asks the module itself, through a session of
// its own, for the key's attributes and value.
func TestModuleKeyNotExportable(t *testing.T) {
	tk := softhsm.New(t)
	generate(t, tk, "ca", certs.ECP256)

	p := miekg.New(tk.Module)
	if p == nil {
		t.Fatal("cannot load the module")
	}
	defer p.Destroy()
	if err := p.Initialize(); err != nil && !errors.Is(err, miekg.Error(miekg.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		t.Fatal(err)
	}
	slots, err := p.GetSlotList(true)
	if err != nil || len(slots) == 0 {
		t.Fatalf("slots: %v %v", slots, err)
	}
	var sh miekg.SessionHandle
	for _, s := range slots {
		if info, err := p.GetTokenInfo(s); err == nil && info.Label == tk.Label {
			if sh, err = p.OpenSession(s, miekg.CKF_SERIAL_SESSION); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer p.CloseSession(sh)
	if err := p.Login(sh, miekg.CKU_USER, tk.PIN); err != nil && !errors.Is(err, miekg.Error(miekg.CKR_USER_ALREADY_LOGGED_IN)) {
		t.Fatal(err)
	}
	if err := p.FindObjectsInit(sh, []*miekg.Attribute{
		miekg.NewAttribute(miekg.CKA_CLASS, miekg.CKO_PRIVATE_KEY),
		miekg.NewAttribute(miekg.CKA_LABEL, "ca"),
	}); err != nil {
		t.Fatal(err)
	}
	objs, _, err := p.FindObjects(sh, 10)
	p.FindObjectsFinal(sh)
	if err != nil || len(objs) != 1 {
		t.Fatalf("private key objects: %v %v", objs, err)
	}
	attrs, err := p.GetAttributeValue(sh, objs[0], []*miekg.Attribute{
		miekg.NewAttribute(miekg.CKA_EXTRACTABLE, nil),
		miekg.NewAttribute(miekg.CKA_SENSITIVE, nil),
		miekg.NewAttribute(miekg.CKA_NEVER_EXTRACTABLE, nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint]byte{miekg.CKA_EXTRACTABLE: 0, miekg.CKA_SENSITIVE: 1, miekg.CKA_NEVER_EXTRACTABLE: 1}
	for _, a := range attrs {
		if len(a.Value) != 1 || a.Value[0] != want[a.Type] {
			t.Errorf("attribute %#x = %v, want %d", a.Type, a.Value, want[a.Type])
		}
	}
	_, err = p.GetAttributeValue(sh, objs[0], []*miekg.Attribute{miekg.NewAttribute(miekg.CKA_VALUE, nil)})
	if !errors.Is(err, miekg.Error(miekg.CKR_ATTRIBUTE_SENSITIVE)) {
		t.Fatalf("reading the private value: %v, want CKR_ATTRIBUTE_SENSITIVE", err)
	}
}

func TestNewRefusesExtractableKey(t *testing.T) {
	tk := softhsm.New(t)
	p := miekg.New(tk.Module)
	if p == nil {
		t.Fatal("cannot load the module")
	}
	defer p.Destroy()
	if err := p.Initialize(); err != nil {
		t.Fatal(err)
	}
	defer p.Finalize()
	slots, err := p.GetSlotList(true)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := p.OpenSession(slots[0], miekg.CKF_SERIAL_SESSION|miekg.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Login(sh, miekg.CKU_USER, tk.PIN); err != nil {
		t.Fatal(err)
	}
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	_, _, err = p.GenerateKeyPair(sh, []*miekg.Mechanism{miekg.NewMechanism(miekg.CKM_EC_KEY_PAIR_GEN, nil)},
		[]*miekg.Attribute{
			miekg.NewAttribute(miekg.CKA_TOKEN, true),
			miekg.NewAttribute(miekg.CKA_VERIFY, true),
			miekg.NewAttribute(miekg.CKA_EC_PARAMS, p256),
			miekg.NewAttribute(miekg.CKA_LABEL, "leaky"),
			miekg.NewAttribute(miekg.CKA_ID, []byte{1}),
		},
		[]*miekg.Attribute{
			miekg.NewAttribute(miekg.CKA_TOKEN, true),
			miekg.NewAttribute(miekg.CKA_SIGN, true),
			miekg.NewAttribute(miekg.CKA_PRIVATE, true),
			miekg.NewAttribute(miekg.CKA_SENSITIVE, false),
			miekg.NewAttribute(miekg.CKA_EXTRACTABLE, true),
			miekg.NewAttribute(miekg.CKA_LABEL, "leaky"),
			miekg.NewAttribute(miekg.CKA_ID, []byte{1}),
		})
	if err != nil {
		t.Fatal(err)
	}
	p.CloseSession(sh)
	p.Finalize()

	_, err = pkcs11.New(pkcs11.Config{URI: mustURI(t, tk.URI("leaky"))})
	if err == nil || !strings.Contains(err.Error(), "CKA_EXTRACTABLE") {
		t.Fatalf("err = %v, want a refusal of an extractable key", err)
	}
}

// TestStartupErrors: each bad configuration fails at start-up with an error
// that says what is wrong, and no error carries the PIN.
func TestStartupErrors(t *testing.T) {
	tk := softhsm.New(t)
	generate(t, tk, "ca", certs.ECP256).Close()
	dir := t.TempDir()
	wrongPIN := filepath.Join(dir, "wrong-pin")
	os.WriteFile(wrongPIN, []byte("9999-wrong\n"), 0o600)
	notModule := filepath.Join(dir, "not-a-module.so")
	os.WriteFile(notModule, []byte("garbage"), 0o644)
	openModule := filepath.Join(dir, "writable.so")
	os.WriteFile(openModule, []byte("garbage"), 0o644)
	os.Chmod(openModule, 0o666)

	base := "pkcs11:token=meshid;object=ca?module-path=" + tk.Module + "&pin-source="
	tests := []struct {
		name, uri, want string
	}{
		{"module missing", "pkcs11:token=meshid;object=ca?module-path=/nonexistent/libsofthsm2.so&pin-source=" + tk.PINFile, "no such file"},
		{"not a module", "pkcs11:token=meshid;object=ca?module-path=" + notModule + "&pin-source=" + tk.PINFile, "failed to open module"},
		{"module writable by others", "pkcs11:token=meshid;object=ca?module-path=" + openModule + "&pin-source=" + tk.PINFile, "writable by group or others"},
		{"wrong PIN", base + wrongPIN, "CKR_PIN_INCORRECT"},
		{"PIN file missing", base + filepath.Join(dir, "absent"), "no such file"},
		{"token missing", "pkcs11:token=other;object=ca?module-path=" + tk.Module + "&pin-source=" + tk.PINFile, "could not find PKCS#11 token"},
		{"key missing", "pkcs11:token=meshid;object=nope?module-path=" + tk.Module + "&pin-source=" + tk.PINFile, `holds no key pair object="nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, err := pkcs11.New(pkcs11.Config{URI: mustURI(t, tc.uri)})
			if err == nil {
				k.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tk.PIN) || strings.Contains(err.Error(), "9999-wrong") {
				t.Fatalf("error carries a PIN: %v", err)
			}
		})
	}
	// Creating a key whose label is taken is refused, not a second key.
	if _, err := pkcs11.Generate(pkcs11.Config{URI: mustURI(t, tk.URI("ca"))}, certs.ECP256); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Fatalf("Generate over an existing key: %v", err)
	}
}

// rawModule loads the module a second time in this process, as a fault
// injector: PKCS#11 state is per process, so what it does to the module
// the CA's Key sees too.
func rawModule(t *testing.T, path string) *miekg.Ctx {
	t.Helper()
	p := miekg.New(path)
	if p == nil {
		t.Fatal("cannot load the module")
	}
	t.Cleanup(p.Destroy)
	return p
}

// TestModuleFailsMidRun: the module is finalized, or loses every session,
// under a running CA. The request in flight fails with Unavailable (the
// gRPC code too), the CA does not crash, and once the module is back a
// later request is signed again.
func TestModuleFailsMidRun(t *testing.T) {
	faults := map[string]func(t *testing.T, p *miekg.Ctx){
		"finalize": func(t *testing.T, p *miekg.Ctx) {
			if err := p.Finalize(); err != nil {
				t.Fatal(err)
			}
		},
		"sessions closed": func(t *testing.T, p *miekg.Ctx) {
			if err := p.Initialize(); !errors.Is(err, miekg.Error(miekg.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
				t.Fatalf("module not in use: %v", err)
			}
			slots, err := p.GetSlotList(true)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range slots {
				if err := p.CloseAllSessions(s); err != nil {
					t.Fatal(err)
				}
			}
		},
	}
	for name, fault := range faults {
		t.Run(name, func(t *testing.T) {
			tk := softhsm.New(t)
			key := generate(t, tk, "ca", certs.ECP256)
			a, _ := hsmAuthority(t, key)
			if _, err := signLeaf(t, a); err != nil {
				t.Fatal(err)
			}

			fault(t, rawModule(t, tk.Module))

			_, err := signLeaf(t, a)
			if err == nil {
				t.Fatal("signed with a failed module")
			}
			if k := ca.KindOf(err); k != ca.KindUnavailable {
				t.Fatalf("kind %v (%v), want unavailable", k, err)
			}
			if c := certservice.Code(err); c != codes.Unavailable {
				t.Fatalf("gRPC code %v, want Unavailable", c)
			}
			if !errors.Is(err, keystore.ErrKeyUnavailable) {
				t.Fatalf("err = %v, want keystore.ErrKeyUnavailable", err)
			}

			iss, err := signLeaf(t, a)
			if err != nil {
				t.Fatalf("module back, but signing still fails: %v", err)
			}
			verifyLeaf(t, iss)
		})
	}
}

func TestClosedKeyIsUnavailable(t *testing.T) {
	tk := softhsm.New(t)
	key := generate(t, tk, "ca", certs.ECP256)
	a, _ := hsmAuthority(t, key)
	key.Close()
	_, err := signLeaf(t, a)
	if ca.KindOf(err) != ca.KindUnavailable {
		t.Fatalf("err = %v, want unavailable", err)
	}
}

// TestReopenIsRateLimited: while the module stays down (here: its token
// is gone), requests fail Unavailable without reopening the module each
// time; one attempt is made per ReopenInterval, and once the token is back
// the key is used again.
func TestReopenIsRateLimited(t *testing.T) {
	tk := softhsm.New(t)
	key := generate(t, tk, "ca", certs.ECP256)
	clk := clock.NewFake(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	pkcs11.SetClock(key, clk)
	a, _ := hsmAuthority(t, key)

	// Hide the token: the module, reinitialised, finds no token.
	hidden := tk.Dir + ".hidden"
	if err := os.Rename(tk.Dir, hidden); err != nil {
		t.Fatal(err)
	}
	if err := rawModule(t, tk.Module).Finalize(); err != nil {
		t.Fatal(err)
	}
	// 1st: the sign fails and the module is closed. 2nd: one reopen
	// attempt, which fails. Then 100 requests within the interval: no
	// attempt (each would cost a C_Initialize).
	for i := range 102 {
		_, err := signLeaf(t, a)
		if ca.KindOf(err) != ca.KindUnavailable {
			t.Fatalf("request %d: %v, want unavailable", i, err)
		}
		if i >= 2 && !strings.Contains(err.Error(), "retrying from") {
			t.Fatalf("request %d reopened the module within the interval: %v", i, err)
		}
	}
	if err := os.Rename(hidden, tk.Dir); err != nil {
		t.Fatal(err)
	}
	if _, err := signLeaf(t, a); err == nil {
		t.Fatal("reopened before the interval passed")
	}
	clk.Add(pkcs11.ReopenInterval)
	iss, err := signLeaf(t, a)
	if err != nil {
		t.Fatalf("module back and interval passed, still: %v", err)
	}
	verifyLeaf(t, iss)
	if n := pkcs11.Reopened(key); n != 1 {
		t.Fatalf("reopened %d times, want 1", n)
	}
}

// TestSoftHSMMissingFailsUnderCI runs this test binary again with the
// module pointed nowhere: without CI the SoftHSM2 tests skip, with CI=true
// they fail, so CI never passes without having run them.
func TestSoftHSMMissingFailsUnderCI(t *testing.T) {
	if os.Getenv("MESHID_SOFTHSM_MODULE") != "" {
		t.Skip("child run")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(exe, "-test.run", "^TestClosedKeyIsUnavailable$", "-test.v")
		// MESHID_REQUIRE_SOFTHSM=1 (make test-unit) fails a skip as CI does:
		// the case without CI is a developer's plain go test.
		cmd.Env = append(os.Environ(), "MESHID_SOFTHSM_MODULE=/nonexistent/libsofthsm2.so", "CI="+ci, "MESHID_REQUIRE_SOFTHSM=")
		out, err := cmd.CombinedOutput()
		switch {
		case ci == "" && (err != nil || !strings.Contains(string(out), "--- SKIP")):
			t.Fatalf("without CI: %v\n%s", err, out)
		case ci == "true" && (err == nil || !strings.Contains(string(out), "may not be skipped")):
			t.Fatalf("with CI=true: %v\n%s", err, out)
		}
	}
}

// TestModuleFailsUnderLoad finalizes the module while 8 goroutines sign:
// every failure is Unavailable, nothing panics, and signing resumes.
//
// The fault is injected between module calls, never during one: PKCS#11
// leaves C_Finalize undefined while other threads are inside the module
// (v2.40 §5.4), and SoftHSM2 2.6 then hangs for ever in C_SignInit or
// crashes (SIGSEGV). What a module call that never returns does to the CA
// is TestSignEndsWithinSessionWait's subject.
//
// inModule keeps the fault out of module calls only if no request returns
// before its module calls do. A request gives up at SessionWait and leaves
// its call running (by design), so with the default 5 s a slow machine (a
// `go test -cover ./ca/...` at load 10-30, where this test died with SIGSEGV
// in C_SignInit) finalized the module under a stranded call. The session
// wait here is therefore far longer than any call.
func TestModuleFailsUnderLoad(t *testing.T) {
	tk := softhsm.New(t)
	key, err := pkcs11.Generate(pkcs11.Config{URI: mustURI(t, tk.URI("ca")), SessionWait: time.Hour}, certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { key.Close() })
	a, _ := hsmAuthority(t, key)
	raw := rawModule(t, tk.Module)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var inModule sync.RWMutex // held shared by each request, alone by the fault
	var failed, signed int
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 {
				if g == 0 && i == 10 {
					inModule.Lock()
					if err := raw.Finalize(); err != nil {
						t.Error(err)
					}
					inModule.Unlock()
				}
				inModule.RLock()
				_, err := signLeaf(t, a)
				inModule.RUnlock()
				mu.Lock()
				if err != nil {
					failed++
					if ca.KindOf(err) != ca.KindUnavailable {
						t.Errorf("kind %v: %v", ca.KindOf(err), err)
					}
				} else {
					signed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed == 0 {
		t.Fatal("no request saw the module fail")
	}
	iss, err := signLeaf(t, a)
	if err != nil {
		t.Fatalf("after the storm: %v", err)
	}
	verifyLeaf(t, iss)
	t.Logf("%d signed, %d unavailable", signed, failed)
}

// stuckModule makes key's module calls never return (until the test ends)
// while stuck is true; otherwise they go to the module. It counts the calls
// that are stuck.
type stuckModule struct {
	stuck   atomic.Bool
	waiting atomic.Int64
	entered chan struct{} // one value per call that got stuck
	release chan struct{}
}

// stuckCalls waits until n calls are stuck in the module.
func (m *stuckModule) stuckCalls(t *testing.T, n int) {
	t.Helper()
	w := watchdog(t)
	for i := range n {
		select {
		case <-m.entered:
		case <-w:
			t.Fatalf("%d of %d calls reached the module", i, n)
		}
	}
}

func hang(t *testing.T, key *pkcs11.Key) *stuckModule {
	m := &stuckModule{entered: make(chan struct{}, 1000), release: make(chan struct{})}
	m.stuck.Store(true)
	t.Cleanup(func() { close(m.release) })
	pkcs11.SetModuleSign(key, func(s crypto.Signer, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
		if m.stuck.Load() {
			m.waiting.Add(1)
			m.entered <- struct{}{}
			<-m.release
			return nil, errors.New("released at the end of the test")
		}
		return s.Sign(rand.Reader, digest, opts)
	})
	return m
}

// watchdog bounds, in real time, a wait that must end at once: it turns a
// hang into a failure instead of a stalled test binary.
func watchdog(t *testing.T) <-chan struct{} {
	done := make(chan struct{})
	tm := time.AfterFunc(time.Minute, func() { close(done) })
	t.Cleanup(func() { tm.Stop() })
	return done
}

// TestSignEndsWithinSessionWait: a module call that never returns (a module
// finalized under a running call, an HSM behind a dead link) fails the
// request Unavailable once SessionWait has passed on the injected clock,
// and the next request reopens the module and is signed. Before the fix,
// Sign waited for the module for ever, and the next failure closed the
// module holding the Key's lock, so every later request hung too.
func TestSignEndsWithinSessionWait(t *testing.T) {
	tk := softhsm.New(t)
	key := generate(t, tk, "ca", certs.ECP256)
	a, _ := hsmAuthority(t, key)
	clk := clock.NewFake(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	pkcs11.SetClock(key, clk)
	m := hang(t, key)

	errc := make(chan error, 1)
	go func() {
		_, err := signLeaf(t, a)
		errc <- err
	}()
	m.stuckCalls(t, 1)
	if !clk.WaitForWaiters(1, watchdog(t)) {
		t.Fatal("Sign set no deadline on the injected clock")
	}
	clk.Add(pkcs11.DefaultSessionWait - time.Nanosecond)
	select {
	case err := <-errc:
		t.Fatalf("returned before the session wait passed: %v", err)
	default:
	}
	clk.Add(time.Nanosecond)
	var err error
	select {
	case err = <-errc:
	case <-watchdog(t):
		t.Fatal("Sign still waits for the module after the session wait")
	}
	if ca.KindOf(err) != ca.KindUnavailable || certservice.Code(err) != codes.Unavailable || !errors.Is(err, keystore.ErrKeyUnavailable) {
		t.Fatalf("err = %v, want Unavailable wrapping keystore.ErrKeyUnavailable", err)
	}
	if !strings.Contains(err.Error(), "did not return within 5s") {
		t.Fatalf("err = %v, want one that says the module did not return", err)
	}

	// The stuck call is still stuck; the module works again.
	m.stuck.Store(false)
	iss, err := signLeaf(t, a)
	if err != nil {
		t.Fatalf("next request with one call stranded: %v", err)
	}
	verifyLeaf(t, iss)
	if n := pkcs11.Reopened(key); n != 1 {
		t.Fatalf("reopened %d times, want 1", n)
	}
	if n := m.waiting.Load(); n != 1 {
		t.Fatalf("%d calls stuck, want 1", n)
	}
}

// TestHungModuleStrandsAtMostMaxSessions: a module that hangs every call,
// asked 50 times at once: each request fails Unavailable at the session
// wait, and no more than MaxSessions calls ever enter the module, so the
// goroutines a dead module strands are bounded.
func TestHungModuleStrandsAtMostMaxSessions(t *testing.T) {
	tk := softhsm.New(t)
	k, err := pkcs11.Generate(pkcs11.Config{URI: mustURI(t, tk.URI("ca")), MaxSessions: 3}, certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	a, _ := hsmAuthority(t, k)
	clk := clock.NewFake(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	pkcs11.SetClock(k, clk)
	m := hang(t, k)

	const n = 50
	errc := make(chan error, n)
	for range n {
		go func() {
			_, err := signLeaf(t, a)
			errc <- err
		}()
	}
	m.stuckCalls(t, 3)
	if !clk.WaitForWaiters(n, watchdog(t)) {
		t.Fatalf("%d of %d requests set a deadline", clk.Waiters(), n)
	}
	clk.Add(pkcs11.DefaultSessionWait)
	for i := range n {
		select {
		case err := <-errc:
			if ca.KindOf(err) != ca.KindUnavailable {
				t.Fatalf("request %d: %v, want unavailable", i, err)
			}
		case <-watchdog(t):
			t.Fatalf("%d of %d requests still wait past the session wait", n-i, n)
		}
	}
	if got := m.waiting.Load(); got != 3 {
		t.Fatalf("%d calls entered the hung module, want MaxSessions (3)", got)
	}
}

func TestConfigRejects(t *testing.T) {
	u := mustURI(t, "pkcs11:token=t;object=k?module-path=/m.so&pin-source=/pin")
	for _, cfg := range []pkcs11.Config{
		{},
		{URI: u, MaxSessions: 1},
		{URI: u, SessionWait: -time.Second},
	} {
		if _, err := pkcs11.New(cfg); err == nil || !strings.Contains(err.Error(), "pkcs11: ") || strings.Contains(err.Error(), "/m.so") {
			t.Errorf("New(%+v) = %v, want a configuration error before the module is touched", cfg, err)
		}
	}
}
