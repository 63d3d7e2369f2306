package certs

import (
	"math/rand/v2"
	"time"
)

// RenewAt returns when a certificate valid from notBefore to notAfter should
// be renewed: at notBefore + ratio*lifetime, moved by up to ±jitter*lifetime.
// ratio is clamped to [0,1]; jitter is the fraction (0.01 for ±1%). The
// result never passes notAfter.
func RenewAt(notBefore, notAfter time.Time, ratio, jitter float64) time.Time {
	return renewAt(notBefore, notAfter, ratio, jitter, rand.Float64())
}

func renewAt(notBefore, notAfter time.Time, ratio, jitter, u float64) time.Time {
	life := notAfter.Sub(notBefore)
	if life <= 0 {
		return notBefore
	}
	ratio = min(max(ratio, 0), 1)
	offset := ratio + jitter*(2*u-1)
	offset = min(max(offset, 0), 1)
	return notBefore.Add(time.Duration(offset * float64(life)))
}
