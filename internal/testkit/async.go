package testkit

// Result is what a function run by Go returned.
type Result[T any] struct {
	Value T
	Err   error
}

// Go runs f in a new goroutine and returns a channel that receives its
// results once, for tests that drive a blocking call (a Run under an
// injected clock) from the test's goroutine.
func Go[T any](f func() (T, error)) <-chan Result[T] {
	done := make(chan Result[T], 1)
	go func() {
		v, err := f()
		done <- Result[T]{v, err}
	}()
	return done
}
