package workloadendpoint_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine started by its tests is still
// running once they are done: Run must stop every stream handler.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
