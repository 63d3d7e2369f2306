package certservice_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine started by them is
// still running once they are done: every component must stop everything
// it starts when its Run returns or its Close is called.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
