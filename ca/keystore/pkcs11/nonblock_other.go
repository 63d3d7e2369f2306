//go:build !unix

package pkcs11

const nonblock = 0
