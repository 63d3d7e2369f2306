package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// ReadManifests decodes every object of a YAML file.
func ReadManifests(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	out, err := DecodeManifests(data)
	if err != nil {
		return nil, fmt.Errorf("harness: %s: %w", path, err)
	}
	return out, nil
}

// DecodeManifests decodes every object of a YAML (or JSON) stream, such as
// a file or what `helm template` prints; empty documents are skipped.
func DecodeManifests(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := map[string]any{}
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// objects reaches objects of any kind as the admin, through discovery.
type objects struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func (c *Cluster) objects() (*objects, error) {
	cfg := c.AdminConfig()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	return &objects{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// resource is the client of obj's kind, in obj's namespace when namespaced.
func (o *objects) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := o.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("harness: %s: %w", gvk, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return o.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()), nil
	}
	return o.dyn.Resource(mapping.Resource), nil
}

// Get returns the live object of obj's kind, namespace and name (a
// NotFound API error when there is none).
func (c *Cluster) Get(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	o, err := c.objects()
	if err != nil {
		return nil, err
	}
	rc, err := o.resource(obj)
	if err != nil {
		return nil, err
	}
	return rc.Get(ctx, obj.GetName(), metav1.GetOptions{})
}

// Apply server-side-applies objs as the admin, for real, with strict field
// validation (what `kubectl apply --server-side` does), and returns the
// objects as the API server stored them.
func (c *Cluster) Apply(ctx context.Context, objs ...*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	o, err := c.objects()
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		rc, err := o.resource(obj)
		if err != nil {
			return nil, err
		}
		data, err := json.Marshal(obj.Object)
		if err != nil {
			return nil, fmt.Errorf("harness: %w", err)
		}
		force := true
		got, err := rc.Patch(ctx, obj.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: "meshid-test", Force: &force, FieldValidation: "Strict"})
		if err != nil {
			return nil, fmt.Errorf("harness: apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		out = append(out, got)
	}
	return out, nil
}
