package interop

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestPeerRecovers crashes the VM's kernel (sysrq c) and checks what the
// suite does when a VM goes down mid-run: Check says so with the panic
// from the console, Restart boots the VM again and puts back what
// OnRestart registered, and the VM answers again.
func TestPeerRecovers(t *testing.T) {
	p, _ := needPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout+2*time.Minute)
	defer cancel()
	if err := p.Check(ctx); err != nil {
		t.Fatalf("the VM is down before the test: %v", err)
	}
	restored := 0
	remove := p.OnRestart(func(ctx context.Context) error {
		restored++
		_, stderr, err := p.Exec(ctx, "touch /tmp/restored")
		if err != nil {
			return errors.New(stderr)
		}
		return nil
	})
	defer remove()
	if _, stderr, err := p.Exec(ctx, "nohup sh -c 'sleep 1; echo c >/proc/sysrq-trigger' >/dev/null 2>&1 &"); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	// The kernel panics and asks to reboot; qemu runs with -no-reboot.
	deadline := time.Now().Add(time.Minute)
	for p.running() {
		if time.Now().After(deadline) {
			t.Fatal("the VM's qemu still runs a minute after the crash")
		}
		time.Sleep(200 * time.Millisecond)
	}
	err := p.Check(ctx)
	if !errors.Is(err, ErrPeerDown) {
		t.Fatalf("Check after the crash: %v, want ErrPeerDown", err)
	}
	if !strings.Contains(err.Error(), "sysrq") {
		t.Errorf("Check's error does not carry the console's panic:\n%v", err)
	}
	if !recoverPeer(t, p) {
		t.Fatal("recoverPeer did not restart the down VM")
	}
	if restored != 1 {
		t.Errorf("the restart hook ran %d times, want 1", restored)
	}
	if err := p.Check(ctx); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if _, _, err := p.Exec(ctx, "test -e /tmp/restored"); err != nil {
		t.Errorf("the restart hook's state is not in the VM: %v", err)
	}
	if recoverPeer(t, p) {
		t.Error("recoverPeer restarted a VM that runs")
	}
}
