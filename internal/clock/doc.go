// Package clock abstracts time so that rotation, expiry and caching can be
// driven step by step in tests. Production code uses Real; tests use Fake.
package clock
