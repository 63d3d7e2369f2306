package fieldlines

import (
	"fmt"
	"reflect"
	"sort"
)

// Lines returns v's exported leaf fields as sorted "path=value" lines. v
// is a struct or a pointer to one.
func Lines(v any) []string {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer {
		rv = rv.Elem()
	}
	var out []string
	walk(rv, "", &out)
	sort.Strings(out)
	return out
}

func walk(v reflect.Value, prefix string, out *[]string) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		leaf(v.Field(i), prefix+f.Name, out)
	}
}

func leaf(v reflect.Value, name string, out *[]string) {
	switch v.Kind() {
	case reflect.Struct:
		if s, ok := v.Interface().(fmt.Stringer); ok {
			*out = append(*out, name+"="+s.String())
			return
		}
		walk(v, name+".", out)
	case reflect.Pointer, reflect.Interface, reflect.Func, reflect.Chan:
		if v.IsNil() {
			*out = append(*out, name+"=<nil>")
			return
		}
		dyn := v
		if v.Kind() == reflect.Interface {
			dyn = v.Elem()
		}
		*out = append(*out, fmt.Sprintf("%s=%s", name, dyn.Type()))
	case reflect.Slice, reflect.Map:
		if v.IsNil() {
			*out = append(*out, name+"=<nil>")
			return
		}
		*out = append(*out, fmt.Sprintf("%s=%v", name, v.Interface()))
	default:
		*out = append(*out, fmt.Sprintf("%s=%v", name, v.Interface()))
	}
}
