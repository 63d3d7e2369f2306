package sdsserver_test

import (
	"testing"

	"go.uber.org/goleak"
)

// verifyNoLeaks runs the package's tests (TestMain in load_test.go calls
// it) and fails them when a goroutine started by them is still running once
// they are done: the server must stop every stream handler and sender when
// Run returns.
func verifyNoLeaks(m *testing.M) {
	goleak.VerifyTestMain(m)
}
