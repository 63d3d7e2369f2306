package main

import (
	"net"
	"testing"
)

// The built-in agent of `meshid dev --listen 0.0.0.0:PORT` (a container)
// dials the CA where its serving certificate is valid: 127.0.0.1, not the
// unspecified address.
func TestDialAddr(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want string
	}{
		{"0.0.0.0", "127.0.0.1:15012"},
		{"::", "127.0.0.1:15012"},
		{"127.0.0.1", "127.0.0.1:15012"},
		{"10.1.2.3", "10.1.2.3:15012"},
		{"::1", "[::1]:15012"},
	} {
		if got := dialAddr(&net.TCPAddr{IP: net.ParseIP(tc.ip), Port: 15012}); got != tc.want {
			t.Errorf("dialAddr(%s) = %s, want %s", tc.ip, got, tc.want)
		}
	}
}
