package upstream

import (
	"crypto/x509"
	"errors"
	"fmt"
)

// checkPathLen refuses an intermediate whose issuers' path length does not
// let it sign leaves: Go's x509 verification counts the certificate it
// verifies as the end of the path, so a CA certificate under an issuer of
// path length 0 verifies, though every leaf it signs would not. One of the
// verified chains (the intermediate first, the root last) must leave room
// for it as an intermediate.
func checkPathLen(chains [][]*x509.Certificate) error {
	var err error
	for _, chain := range chains {
		if err = pathLenFits(chain); err == nil {
			return nil
		}
	}
	if err == nil {
		err = errors.New("no verified chain")
	}
	return err
}

func pathLenFits(chain []*x509.Certificate) error {
	// The CAs below chain[j] in a leaf's path are chain[0..j-1].
	for j := 1; j < len(chain); j++ {
		if c := chain[j]; c.BasicConstraintsValid && c.MaxPathLen >= 0 && c.MaxPathLen < j && (c.MaxPathLen > 0 || c.MaxPathLenZero) {
			return fmt.Errorf("%q has path length %d: the intermediate under it could sign no leaf that verifies", c.Subject, c.MaxPathLen)
		}
	}
	return nil
}
