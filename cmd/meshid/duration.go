package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// dayDuration is a time.Duration flag that also takes whole days ("7d"),
// the unit certificate lifetimes are usually thought in.
type dayDuration time.Duration

func (d *dayDuration) String() string {
	if *d == 0 {
		return "0" // pflag's zero value: no "(default ...)" in the help
	}
	return time.Duration(*d).String()
}

func (d *dayDuration) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(days, 10, 32)
		if err != nil {
			return fmt.Errorf("invalid duration %q", s)
		}
		*d = dayDuration(time.Duration(n) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	*d = dayDuration(v)
	return nil
}

func (d *dayDuration) Type() string { return "duration" }
