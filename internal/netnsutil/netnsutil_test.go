package netnsutil

import (
	"fmt"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestNamespaceLifecycle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces; run the tests as root to include it")
	}
	prefix := fmt.Sprintf("tpt-nsutil-%d-", os.Getpid())
	name := prefix + "a"
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	defer Delete(name)
	names, err := List(prefix)
	if err != nil || len(names) != 1 || names[0] != name {
		t.Fatalf("List = %v, %v", names, err)
	}
	// A bridge created inside is visible there and not here.
	err = Do(Path(name), func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "dummy7"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName("dummy7"); err == nil {
		t.Fatal("the bridge appeared in the test's own namespace")
	}
	err = Do(Path(name), func(h *netlink.Handle) error {
		_, err := h.LinkByName("dummy7")
		return err
	})
	if err != nil {
		t.Fatalf("bridge not in the namespace: %v", err)
	}
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	if names, _ := List(prefix); len(names) != 0 {
		t.Fatalf("still listed: %v", names)
	}
	if err := Do(Path(name), func(*netlink.Handle) error { return nil }); err == nil {
		t.Fatal("Do in a deleted namespace succeeded")
	}
}
