package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/meshid/meshid/certs"
)

// WriteTable writes one row per result, then one line per problem and
// one per private key checked against its certificate. With verbose it adds
// every certificate's details.
func WriteTable(w io.Writer, rep *Report, verbose bool) error {
	return WriteTableStyle(w, rep, TableStyle{Verbose: verbose})
}

// TableStyle is how WriteTableStyle draws the table.
type TableStyle struct {
	Verbose bool // every certificate's details under the table
	// Terminal is for a person at a terminal (cmd sets it only when
	// standard output is one, and not with NO_COLOR): VALID in colour and
	// no NOT BEFORE column, so a row fits a narrower window. Pipes and
	// files always get the full, plain table.
	Terminal bool
}

// ANSI colours of the VALID column. Every code has the same length, and the
// header gets one too, so tabwriter (which counts bytes) still aligns the
// columns.
const (
	ansiGreen = "\x1b[32m"
	ansiRed   = "\x1b[31m"
	ansiBold  = "\x1b[01m"
	ansiReset = "\x1b[0m"
)

// WriteTableStyle is WriteTable in a given style.
func WriteTableStyle(w io.Writer, rep *Report, st TableStyle) error {
	ew := &errWriter{w: w}
	tw := tabwriter.NewWriter(ew, 0, 0, 3, ' ', 0)
	valid := func(v string, ok bool) string {
		if !st.Terminal {
			return v
		}
		c := ansiRed
		switch {
		case v == "VALID":
			c = ansiBold
		case ok:
			c = ansiGreen
		}
		return c + v + ansiReset
	}
	if st.Terminal {
		fmt.Fprintf(tw, "%s\tTYPE\t%s\tSPIFFE ID\tSERIAL\tNOT AFTER\tEXPIRES IN\n", nameHeader(rep), valid("VALID", true))
	} else {
		fmt.Fprintf(tw, "%s\tTYPE\tVALID\tSPIFFE ID\tSERIAL\tNOT BEFORE\tNOT AFTER\tEXPIRES IN\n", nameHeader(rep))
	}
	for _, r := range rep.Results {
		nb, na := "-", "-"
		if r.NotBefore != nil {
			nb, na = stamp(*r.NotBefore), stamp(*r.NotAfter)
		}
		if st.Terminal {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				displayName(r.Name), r.Type, valid(fmt.Sprint(r.Valid), r.Valid), dash(r.SPIFFEID), dash(r.Serial), na, dash(r.ExpiresIn))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%s\t%s\t%s\t%s\t%s\n",
			displayName(r.Name), r.Type, r.Valid, dash(r.SPIFFEID), dash(r.Serial), nb, na, dash(r.ExpiresIn))
	}
	tw.Flush()
	writeNotes(ew, rep)
	if st.Verbose {
		for _, r := range rep.Results {
			writeDetail(ew, r)
		}
	}
	return ew.err
}

// writeNotes writes the problems, then the private keys checked against
// their certificate (a mismatch is also a problem), so that a key match is
// confirmed without -v.
func writeNotes(w io.Writer, rep *Report) {
	first := true
	note := func(format string, args ...any) {
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, format, args...)
	}
	for _, r := range rep.Results {
		for _, p := range r.Problems {
			if p.Code == CodeExpiring {
				note("%s: warning: %s\n", displayName(r.Name), p.Message)
			} else {
				note("%s: %s\n", displayName(r.Name), p.Message)
			}
		}
	}
	for _, r := range rep.Results {
		if k := r.PrivateKey; k != nil && k.Matches != nil && *k.Matches {
			note("%s: private key (%s, from %s) matches\n", displayName(r.Name), k.PublicKey.Type, displayName(k.Source))
		}
	}
}

func nameHeader(rep *Report) string {
	sds, other := false, false
	for _, r := range rep.Results {
		if r.Origin == OriginSDS || r.Origin == OriginWorkloadAPI { // served resources, not files
			sds = true
		} else {
			other = true
		}
	}
	switch {
	case sds && other:
		return "RESOURCE/FILE"
	case sds:
		return "RESOURCE"
	}
	return "FILE"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func writeDetail(w io.Writer, r Result) {
	fmt.Fprintf(w, "\n%s (%s, from %s)\n", displayName(r.Name), r.Type, r.Origin)
	line := func(indent, k, v string) { fmt.Fprintf(w, "%s%-21s%s\n", indent, k+":", v) }
	line("  ", "Valid", fmt.Sprint(r.Valid))
	switch {
	case len(r.Certificates) == 0:
	case r.VerifiedAgainst != "":
		line("  ", "Verified against", displayName(r.VerifiedAgainst))
	case r.Type == TypeCA && r.Certificates[0].SelfSigned:
		line("  ", "Verified against", "- (trust anchors; give --roots to compare)")
	default:
		line("  ", "Verified against", "nothing (no trusted roots given; use --roots)")
	}
	if k := r.PrivateKey; k != nil {
		v := fmt.Sprintf("%s from %s", k.PublicKey.Type, displayName(k.Source))
		switch {
		case k.Matches == nil:
		case *k.Matches:
			v += ", matches"
		default:
			v += ", DOES NOT MATCH"
		}
		line("  ", "Private key", v)
	}
	if c := r.CSR; c != nil {
		line("  ", "Subject", dash(c.Subject))
		line("  ", "SPIFFE ID", dash(c.SPIFFEID))
		line("  ", "SANs", dash(sanList(c.SANs)))
		line("  ", "Public key", keyText(c.PublicKey))
		line("  ", "Signature algorithm", c.SignatureAlgorithm)
		line("  ", "Signature valid", fmt.Sprint(c.SignatureValid))
	}
	for i, c := range r.Certificates {
		fmt.Fprintf(w, "  Certificate %d:\n", i)
		in := "    "
		line(in, "Subject", dash(c.Subject))
		line(in, "Issuer", dash(c.Issuer))
		line(in, "SPIFFE ID", dash(c.SPIFFEID))
		line(in, "SANs", dash(sanList(c.SANs)))
		line(in, "Serial", c.Serial)
		line(in, "Not before", stamp(c.NotBefore))
		line(in, "Not after", fmt.Sprintf("%s (expires in %s)", stamp(c.NotAfter), c.ExpiresIn))
		line(in, "Public key", keyText(c.PublicKey))
		line(in, "Signature algorithm", c.SignatureAlgorithm)
		line(in, "Key usage", dash(strings.Join(c.KeyUsage, ", ")))
		line(in, "Extended key usage", dash(strings.Join(c.ExtKeyUsage, ", ")))
		line(in, "Basic constraints", basicText(c.BasicConstraints))
		line(in, "SHA-256 fingerprint", c.SHA256Fingerprint)
		line(in, "Subject key ID", dash(c.SubjectKeyID))
		line(in, "Authority key ID", dash(c.AuthorityKeyID))
		line(in, "Self-signed", fmt.Sprint(c.SelfSigned))
	}
}

func sanList(s SANs) string {
	var parts []string
	for _, v := range s.URI {
		parts = append(parts, "URI:"+v)
	}
	for _, v := range s.DNS {
		parts = append(parts, "DNS:"+v)
	}
	for _, v := range s.IP {
		parts = append(parts, "IP:"+v)
	}
	for _, v := range s.Email {
		parts = append(parts, "email:"+v)
	}
	return strings.Join(parts, ", ")
}

func keyText(k PublicKey) string {
	return fmt.Sprintf("%s (%s, %d bits)", k.Type, k.Algorithm, k.Bits)
}

func basicText(b *BasicConstraints) string {
	switch {
	case b == nil:
		return "-"
	case !b.CA:
		return "CA:false"
	case b.MaxPathLen == nil:
		return "CA:true, pathlen:unlimited"
	}
	return fmt.Sprintf("CA:true, pathlen:%d", *b.MaxPathLen)
}

// WriteJSON writes the report as indented JSON (the documented shape).
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WritePEM writes every input's certificates, and CSRs, as PEM. Private
// keys are never written.
func WritePEM(w io.Writer, inputs []*Input) error {
	for _, in := range inputs {
		if _, err := w.Write(certs.EncodeCertificates(in.Certs...)); err != nil {
			return err
		}
		if in.CSR != nil {
			if _, err := w.Write(certs.EncodeCSR(in.CSR.Raw)); err != nil {
				return err
			}
		}
	}
	return nil
}

// errWriter remembers the first write error so rendering code stays flat.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
