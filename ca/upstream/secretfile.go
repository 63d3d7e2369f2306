package upstream

import (
	"fmt"
	"io"
	"os"
)

// ReadSecretFile reads a credentials file whole: a regular file (a symbolic link is followed, as in a mounted
// Secret) that neither group nor others may read or write, at most
// MaxCredentialsSize bytes. Errors name the file, never its contents. ReadHexKey
// (cfssl) and the step-ca backend's JWK read through it.
func ReadSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("upstream credentials: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("upstream credentials: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("upstream credentials: %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o037 != 0 {
		return nil, fmt.Errorf("upstream credentials: %s: mode %#o lets others access it or the group write it; want 0600, 0400 or 0440", path, perm)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxCredentialsSize+1))
	if err != nil {
		return nil, fmt.Errorf("upstream credentials: %w", err)
	}
	if len(data) > MaxCredentialsSize {
		return nil, fmt.Errorf("upstream credentials: %s: more than %d bytes", path, MaxCredentialsSize)
	}
	return data, nil
}
