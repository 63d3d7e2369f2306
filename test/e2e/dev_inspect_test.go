package e2e_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/internal/clock"
)

// inspectReport is the documented, stable JSON shape of `meshid inspect -o
// json` (the fields this suite relies on).
type inspectReport struct {
	Status  string `json:"status"`
	Valid   bool   `json:"valid"`
	Results []struct {
		Name            string     `json:"name"`
		Origin          string     `json:"origin"`
		Type            string     `json:"type"`
		Valid           bool       `json:"valid"`
		SPIFFEID        string     `json:"spiffe_id"`
		Serial          string     `json:"serial"`
		NotAfter        *time.Time `json:"not_after"`
		ExpiresIn       string     `json:"expires_in"`
		VerifiedAgainst string     `json:"verified_against"`
		Problems        []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"problems"`
		PrivateKey *struct {
			Matches *bool `json:"matches"`
		} `json:"private_key"`
	} `json:"results"`
}

func parseReport(t *testing.T, res result) *inspectReport {
	t.Helper()
	rep := &inspectReport{}
	if err := json.Unmarshal([]byte(res.stdout), rep); err != nil {
		t.Fatalf("inspect -o json printed invalid JSON: %v\n%s", err, res.stdout)
	}
	return rep
}

// tableRows returns the table's rows (after the header) keyed by their
// first column.
func tableRows(t *testing.T, out string) map[string][]string {
	t.Helper()
	lines := strings.Split(out, "\n")
	if len(lines) < 2 {
		t.Fatalf("no table in:\n%s", out)
	}
	rows := map[string][]string{}
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			break // problems follow an empty line
		}
		f := strings.Fields(l)
		rows[f[0]] = f
	}
	return rows
}

var expiresIn = regexp.MustCompile(`^(\d+d)?(\d+h)?(\d+m)?$`)

// Issue 4, done when: `meshid inspect --sds <state-dir>/sds.sock` during
// `meshid dev` prints both resources as valid, with the SPIFFE ID and the
// expiry; on an expired or foreign certificate it says why and exits
// non-zero.
func TestDevInspect(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	const wantID = "spiffe://cluster.local/ns/default/sa/default"

	t.Run("sds table", func(t *testing.T) {
		res := mustMeshid(t, "inspect", "--sds", d.sock)
		if !strings.HasPrefix(res.stdout, "RESOURCE") {
			t.Fatalf("table header:\n%s", res.stdout)
		}
		rows := tableRows(t, res.stdout)
		for _, name := range []string{"default", "ROOTCA"} {
			row := rows[name]
			if row == nil {
				t.Fatalf("no row for %s:\n%s", name, res.stdout)
			}
			if !strings.Contains(strings.Join(row, " "), " true ") {
				t.Fatalf("%s is not shown as valid:\n%s", name, res.stdout)
			}
			if last := row[len(row)-1]; last == "-" || !expiresIn.MatchString(last) {
				t.Fatalf("%s: EXPIRES IN is %q:\n%s", name, last, res.stdout)
			}
		}
		if !strings.Contains(strings.Join(rows["default"], " "), wantID) {
			t.Fatalf("default does not show %s:\n%s", wantID, res.stdout)
		}
	})

	t.Run("sds json", func(t *testing.T) {
		rep := parseReport(t, mustMeshid(t, "inspect", "--sds", d.sock, "-o", "json"))
		if rep.Status != "ok" || !rep.Valid || len(rep.Results) != 2 {
			t.Fatalf("report: %+v", rep)
		}
		for _, r := range rep.Results {
			if !r.Valid || r.Origin != "sds" || r.NotAfter == nil || !r.NotAfter.After(time.Now()) || r.ExpiresIn == "" {
				t.Fatalf("result %+v", r)
			}
			switch r.Name {
			case "default":
				if r.SPIFFEID != wantID || r.VerifiedAgainst == "" {
					t.Fatalf("default: SPIFFE ID %q, verified against %q", r.SPIFFEID, r.VerifiedAgainst)
				}
				if hours := time.Until(*r.NotAfter).Hours(); hours < 23 || hours > 24.1 {
					t.Fatalf("default expires in %.1fh, want the agent's 24h", hours)
				}
			case "ROOTCA":
			default:
				t.Fatalf("unexpected resource %q", r.Name)
			}
		}
	})

	t.Run("expires within", func(t *testing.T) {
		// The workload certificate lives 24h: a 48h window flags it.
		res := runMeshid(t, nil, "inspect", "--sds", d.sock, "--expires-within", "48h")
		if res.code != 3 {
			t.Fatalf("exit %d, want 3 (expiring)\n%s%s", res.code, res.stdout, res.stderr)
		}
	})

	dir := t.TempDir()
	t.Run("expired", func(t *testing.T) {
		// A leaf from a real Authority whose clock is two days back, for
		// one hour: it expired a day and 23 hours ago.
		a := newAuthority(t, clock.NewFake(time.Now().Add(-48*time.Hour)))
		iss, _ := issueLeaf(t, a, mustID(t, "shop", "cart"), time.Hour)
		roots := writePEM(t, dir, "expired-root.pem", iss.Roots...)
		leaf := writePEM(t, dir, "expired.pem", append(append(iss.Chain[:0:0], iss.Leaf), iss.Chain...)...)

		res := runMeshid(t, nil, "inspect", "--roots", roots, leaf)
		if res.code != 4 || !strings.Contains(res.stdout, "expired at") {
			t.Fatalf("exit %d, want 4 saying it expired:\n%s%s", res.code, res.stdout, res.stderr)
		}
		rep := parseReport(t, runMeshid(t, nil, "inspect", "--roots", roots, leaf, "-o", "json"))
		wantProblem(t, rep, "expired")
	})

	t.Run("foreign", func(t *testing.T) {
		// A valid leaf from another CA, checked against the dev root.
		a := newAuthority(t, nil)
		iss, _ := issueLeaf(t, a, mustID(t, "default", "default"), time.Hour)
		leaf := writePEM(t, dir, "foreign.pem", iss.Leaf)

		res := runMeshid(t, nil, "inspect", "--roots", d.root, leaf)
		if res.code != 4 || !strings.Contains(res.stdout, "unknown issuer") {
			t.Fatalf("exit %d, want 4 saying the issuer is unknown:\n%s%s", res.code, res.stdout, res.stderr)
		}
		rep := parseReport(t, runMeshid(t, nil, "inspect", "--roots", d.root, leaf, "-o", "json"))
		wantProblem(t, rep, "unknown_issuer")
	})
}

// wantProblem checks that the report is invalid with the problem code.
func wantProblem(t *testing.T, rep *inspectReport, code string) {
	t.Helper()
	if rep.Valid || rep.Status != "invalid" || len(rep.Results) != 1 || rep.Results[0].Valid {
		t.Fatalf("report %+v, want one invalid result", rep)
	}
	for _, p := range rep.Results[0].Problems {
		if p.Code == code && p.Message != "" {
			return
		}
	}
	t.Fatalf("problems %+v, want %q", rep.Results[0].Problems, code)
}
