//go:build unix

package pkcs11

import "syscall"

const nonblock = syscall.O_NONBLOCK
