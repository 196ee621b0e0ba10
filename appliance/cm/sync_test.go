package cm_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taproce/taproce/appliance/cm"
)

// direct is a Wire that hands each MAD to the peer's manager at once,
// inside SendMAD, as a local switch between two ports of one appliance
// may: the peer answers from within the call, and its owner's answers
// come back the same way.
type direct struct {
	peer *cm.Manager
	sent atomic.Int64
}

func (d *direct) SendMAD(r cm.Route, mad *[cm.MADLen]byte) {
	d.sent.Add(1)
	d.peer.Receive(r.Src, r.Dst, mad[:])
}

// TestSynchronousWire: two managers wired to call each other from
// SendMAD, their owners answering from within Events, on many
// goroutines at once: no deadlock, every connection established and
// disconnected, each ID's events in order, nothing left. Run with -race
// it checks the lock discipline too.
func TestSynchronousWire(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	var mu sync.Mutex // the clock and the event log
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clk.now }
	wa, wb := &direct{}, &direct{}
	events := map[cm.Owner]map[cm.ID][]cm.EventType{ownA: {}, ownB: {}}
	var a, b *cm.Manager
	owner := func(m **cm.Manager, hangUp bool) func(e cm.Event) {
		return func(e cm.Event) {
			mu.Lock()
			events[e.Owner][e.ID] = append(events[e.Owner][e.ID], e.Type)
			mu.Unlock()
			switch e.Type {
			case cm.EventConnectRequest:
				if err := (*m).Accept(e.ID, acceptParams(0x100+uint32(e.ID))); err != nil {
					t.Error(err)
				}
			case cm.EventConnectResponse:
				if err := (*m).Establish(e.ID, nil); err != nil {
					t.Error(err)
				}
			case cm.EventDisconnected:
				if !hangUp {
					return
				}
				if err := (*m).Destroy(e.ID); err != nil {
					t.Error(err)
				}
			}
		}
	}
	var err error
	if a, err = cm.New(cm.Config{Wire: wa, Now: now, GUID: guidA, Seed: 1, Events: owner(&a, false)}); err != nil {
		t.Fatal(err)
	}
	if b, err = cm.New(cm.Config{Wire: wb, Now: now, GUID: guidB, Seed: 2, Events: owner(&b, true)}); err != nil {
		t.Fatal(err)
	}
	wa.peer, wb.peer = b, a
	if _, err := b.Listen(ownB, cm.ListenParams{Port: 7174, PortSpace: cm.PortSpaceTCP}); err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 25
	var wg sync.WaitGroup
	ids := make([][]cm.ID, workers)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id, err := a.Connect(ownA, connectParams(addrA, addrB, 7174, uint32(g*each+i)))
				if err != nil {
					t.Error(err)
					return
				}
				ids[g] = append(ids[g], id)
				a.Tick()
				b.Tick()
			}
		}()
	}
	wg.Wait()
	for _, l := range ids {
		for _, id := range l {
			if i, err := a.Info(id); err != nil || i.State != cm.StateEstablished {
				t.Fatalf("ID %d: %+v, %v", id, i, err)
			}
		}
	}
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, id := range ids[g] {
				if err := a.Disconnect(id, nil); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	clk.now = clk.now.Add(time.Minute)
	mu.Unlock()
	a.Tick()
	for _, l := range ids {
		for _, id := range l {
			if err := a.Destroy(id); err != nil {
				t.Error(err)
			}
		}
	}
	a.CloseOwner(ownA)
	b.CloseOwner(ownB)
	want := map[cm.Owner][]cm.EventType{
		ownA: {cm.EventConnectResponse, cm.EventDisconnected, cm.EventTimeWaitExit},
		ownB: {cm.EventConnectRequest, cm.EventEstablished, cm.EventDisconnected},
	}
	for o, byID := range events {
		if len(byID) != workers*each {
			t.Errorf("owner %d: events for %d IDs", o, len(byID))
		}
		for id, got := range byID {
			if len(got) != len(want[o]) {
				t.Errorf("owner %d ID %d: %v", o, id, got)
				continue
			}
			for i := range got {
				if got[i] != want[o][i] {
					t.Errorf("owner %d ID %d: %v, want %v", o, id, got, want[o])
					break
				}
			}
		}
	}
	for _, m := range []*cm.Manager{a, b} {
		if err := cm.CheckInvariants(m); err != nil {
			t.Fatal(err)
		}
		for k, v := range cm.Sizes(m) {
			if v != 0 {
				t.Errorf("%s holds %d", k, v)
			}
		}
	}
	if n := wa.sent.Load() + wb.sent.Load(); n != workers*each*5 {
		t.Errorf("%d MADs, want %d (REQ, REP, RTU, DREQ, DREP each)", n, workers*each*5)
	}
}
