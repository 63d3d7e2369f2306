// Package fieldlines prints a struct as sorted "Field.Path=value" lines, one
// per exported leaf field, for golden tests that pin a Config's defaults
// (ca/caserver's and sds/agent's TestDefaultsGolden): a default that
// changes changes one line of the golden file, which a reviewer sees.
//
// A value is printed with fmt (a Stringer's String, a Duration as 24h0m0s);
// a nil pointer, interface, slice, map or func as <nil>; a non-nil pointer,
// interface, func or channel as its dynamic type only (a Logger, a Clock, a
// Registry: what they are, never their address); a struct that is not a
// Stringer field by field.
package fieldlines
