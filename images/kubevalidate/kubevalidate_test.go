// Package kubevalidate_test decodes every document of the YAML files of
// images/ strictly into its Kubernetes API type, as the API server's
// strict field validation does: an unknown or misspelt field (also in the
// wrong case), a value of the wrong type or a repeated key fails the test.
package kubevalidate_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/taproce/taproce/config"
	"github.com/taproce/taproce/images"
)

// NetworkAttachmentDefinition is Multus' type
// (k8s.cni.cncf.io/v1), as its client module defines it.
type NetworkAttachmentDefinition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Config string `json:"config"`
	} `json:"spec"`
}

// newObject returns an object of the API type of apiVersion and kind.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 Pod":
		return &corev1.Pod{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "k8s.cni.cncf.io/v1 NetworkAttachmentDefinition":
		return &NetworkAttachmentDefinition{}
	}
	return nil
}

// TestStrictDecoding: every document of every YAML file decodes strictly
// into its type; the ConfigMap's configuration is one the appliance
// accepts.
func TestStrictDecoding(t *testing.T) {
	files, err := filepath.Glob("../*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files: %v", err)
	}
	kinds := map[string]int{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s#%d: %v", f, i, err)
			}
			if tm.Kind == "" {
				continue // only comments
			}
			obj := newObject(tm.APIVersion, tm.Kind)
			if obj == nil {
				t.Errorf("%s#%d: no type for %s %s", f, i, tm.APIVersion, tm.Kind)
				continue
			}
			if err := decodeStrict(doc, obj); err != nil {
				t.Errorf("%s#%d %s: %v", f, i, tm.Kind, err)
				continue
			}
			kinds[tm.Kind]++
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name == images.ConfigMapName {
				if _, err := config.Parse([]byte(cm.Data[images.ConfigKey]), "ConfigMap "+cm.Name); err != nil {
					t.Errorf("the ConfigMap's configuration: %v", err)
				}
			}
			if ds, ok := obj.(*appsv1.DaemonSet); ok {
				checkDaemonSet(t, ds)
			}
		}
	}
	for _, k := range []string{"Namespace", "ConfigMap", "DaemonSet", "Service", "Pod", "NetworkAttachmentDefinition"} {
		if kinds[k] == 0 {
			t.Errorf("no %s among the manifests", k)
		}
	}
	t.Logf("decoded %v", kinds)
}

// decodeStrict decodes a YAML document as the API server does with
// strict field validation: repeated keys, unknown fields and fields
// spelt in another case are errors.
func decodeStrict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// checkDaemonSet checks what the typed form makes easy: the selector
// matches the template, the probes are HTTP on the loopback, and the
// host paths have types.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labelSet(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet %s: the selector %v does not match the template's labels %v", ds.Name, sel, ds.Spec.Template.Labels)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Path != "/healthz" {
				t.Errorf("container %s: %s probe %+v", c.Name, name, p)
			}
		}
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || *c.SecurityContext.Privileged {
			t.Errorf("container %s must say privileged: false", c.Name)
		}
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && (v.HostPath.Type == nil || *v.HostPath.Type == corev1.HostPathUnset) {
			t.Errorf("hostPath volume %s has no type", v.Name)
		}
	}
}

type labelSet map[string]string

func (l labelSet) Has(k string) bool              { _, ok := l[k]; return ok }
func (l labelSet) Get(k string) string            { return l[k] }
func (l labelSet) Lookup(k string) (string, bool) { v, ok := l[k]; return v, ok }
