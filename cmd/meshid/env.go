package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// envDefault applies an environment variable as the value of a flag the user
// did not set. This is the only place meshid reads the environment, so that
// operators can swap istiod or istio-agent for meshid with their env intact.
func envDefault(fs *pflag.FlagSet, flag, env string) error {
	f := fs.Lookup(flag)
	if f == nil || f.Changed {
		return nil
	}
	v, ok := os.LookupEnv(env)
	if !ok || v == "" {
		return nil
	}
	if f.Value.Type() == "duration" {
		// Istio's env durations are Go durations; accept plain seconds
		// too, as some charts write them.
		if n, err := strconv.Atoi(v); err == nil {
			v = (time.Duration(n) * time.Second).String()
		}
	}
	if err := fs.Set(flag, strings.TrimSpace(v)); err != nil {
		return fmt.Errorf("environment %s: %w", env, err)
	}
	return nil
}

// envDefaults applies several flag/env pairs.
func envDefaults(fs *pflag.FlagSet, pairs ...[2]string) error {
	for _, p := range pairs {
		if err := envDefault(fs, p[0], p[1]); err != nil {
			return err
		}
	}
	return nil
}
