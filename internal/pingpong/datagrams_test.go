package pingpong

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/taproce/taproce/verbs"
)

// fakeSeqQueues records the bounded loop's SENDs (their sequence numbers)
// and its receive posts; room limits the receives accepted.
type fakeSeqQueues struct {
	sends []uint32
	recvs []int
	room  int
}

func (f *fakeSeqQueues) PostSendSeq(seq uint32) error {
	f.sends = append(f.sends, seq)
	return nil
}

func (f *fakeSeqQueues) PostRecv(n int) int {
	n = min(n, f.room)
	f.room -= n
	f.recvs = append(f.recvs, n)
	return n
}

// event is one thing that happens to a bounded loop: a SEND's completion
// ("send"), a receive with immediate data imm ("recv"), one without
// ("plain"), or the end of its wait ("expire").
type event struct {
	kind string
	imm  uint32
}

func (e event) apply(d *Datagrams, now time.Time) error {
	switch e.kind {
	case "send":
		return d.Complete(&verbs.WC{ID: SendWRID}, now, nil)
	case "recv":
		return d.Complete(&verbs.WC{ID: RecvWRID, Imm: e.imm, Flags: verbs.WCWithImm}, now, nil)
	case "plain":
		return d.Complete(&verbs.WC{ID: RecvWRID}, now, nil)
	case "expire":
		return d.Expire(now)
	}
	panic("unknown event " + e.kind)
}

var (
	send   = event{kind: "send"}
	plain  = event{kind: "plain"}
	expire = event{kind: "expire"}
)

func recv(imm uint32) event { return event{"recv", imm} }

// TestDatagrams: the bounded UD loop counts each round trip once, whatever
// the link loses, duplicates or delays; the client sends the next request
// after an answer or at its deadline (never before the SEND completed);
// the server answers each new request once, echoing its number, and ends
// with the last one or at its deadline.
func TestDatagrams(t *testing.T) {
	const wait = 50 * time.Millisecond
	for _, c := range []struct {
		name   string
		client bool
		events []event
		// sends are the sequence numbers sent, in order.
		sends                   []uint32
		done                    bool
		received, ignored, lost int
	}{
		{
			name: "client, no loss", client: true,
			events: []event{send, recv(1), recv(2), send, send, recv(3)},
			sends:  []uint32{1, 2, 3}, done: true, received: 3,
		},
		{
			name: "client, the answer before the SEND's completion", client: true,
			events: []event{recv(1), send},
			sends:  []uint32{1, 2}, received: 1,
		},
		{
			name: "client, a round trip lost", client: true,
			events: []event{send, expire, send, recv(2), send, recv(3)},
			sends:  []uint32{1, 2, 3}, done: true, received: 2, lost: 1,
		},
		{
			name: "client, a late answer and a duplicate ignored", client: true,
			events: []event{send, expire, send, recv(1), recv(2), recv(2), send, recv(3)},
			sends:  []uint32{1, 2, 3}, done: true, received: 2, ignored: 2, lost: 1,
		},
		{
			name: "client, every round trip lost", client: true,
			events: []event{send, expire, send, expire, send, expire},
			sends:  []uint32{1, 2, 3}, done: true, lost: 3,
		},
		{
			name: "client, a plain ibv_ud_pingpong server's answer", client: true,
			events: []event{send, plain, send, plain, send, plain},
			sends:  []uint32{1, 2, 3}, done: true, received: 3,
		},
		{
			name:   "server, no loss",
			events: []event{recv(1), send, recv(2), send, recv(3), send},
			sends:  []uint32{1, 2, 3}, done: true, received: 3,
		},
		{
			name:   "server, a request lost",
			events: []event{recv(1), send, recv(3), send},
			sends:  []uint32{1, 3}, done: true, received: 2, lost: 1,
		},
		{
			name:   "server, duplicates and old requests not answered",
			events: []event{recv(1), recv(1), send, recv(2), send, recv(1), recv(2), recv(9)},
			sends:  []uint32{1, 2}, received: 2, ignored: 4, lost: 1,
		},
		{
			name:   "server, a request while the last answer goes out",
			events: []event{recv(1), recv(2), send, send},
			sends:  []uint32{1, 2}, received: 2, lost: 1,
		},
		{
			name:   "server, the last request lost: ends at its deadline",
			events: []event{recv(1), send, recv(2), send, expire},
			sends:  []uint32{1, 2}, done: true, received: 2, lost: 1,
		},
		{
			name:   "server, a plain ibv_ud_pingpong client's requests",
			events: []event{plain, send, plain, send, plain, send},
			sends:  []uint32{1, 2, 3}, done: true, received: 3,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := &fakeSeqQueues{room: 1 << 30}
			d, err := NewDatagrams(q, c.client, 3, 4, wait)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1000, 0)
			if err := d.Start(now); err != nil {
				t.Fatal(err)
			}
			for i, e := range c.events {
				now = now.Add(time.Millisecond)
				if err := e.apply(d, now); err != nil {
					t.Fatalf("event %d (%v): %v", i, e, err)
				}
			}
			if fmt.Sprint(q.sends) != fmt.Sprint(c.sends) || d.Done() != c.done || d.Received != c.received ||
				d.Ignored != c.ignored || (c.done && d.Lost() != c.lost) {
				t.Errorf("sends %v, done %v, received %d, ignored %d, lost %d; want %v, %v, %d, %d, %d",
					q.sends, d.Done(), d.Received, d.Ignored, d.Lost(), c.sends, c.done, c.received, c.ignored, c.lost)
			}
		})
	}
}

// TestDatagramsDeadlines: the client waits one wait from each request's
// SEND; the server, from each new request, one wait per request left and
// one more.
func TestDatagramsDeadlines(t *testing.T) {
	const wait = 50 * time.Millisecond
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	q := &fakeSeqQueues{room: 100}
	cl, _ := NewDatagrams(q, true, 10, 4, wait)
	if err := cl.Start(t0); err != nil || cl.Deadline() != at(wait) {
		t.Fatalf("client start: deadline %v, %v", cl.Deadline().Sub(t0), err)
	}
	_ = cl.Complete(&verbs.WC{ID: SendWRID}, at(time.Millisecond), nil)
	if err := cl.Expire(at(wait)); err != nil || cl.Deadline() != at(2*wait) {
		t.Fatalf("client after a loss: deadline %v, %v", cl.Deadline().Sub(t0), err)
	}

	srv, _ := NewDatagrams(&fakeSeqQueues{room: 100}, false, 10, 4, wait)
	if err := srv.Start(t0); err != nil || srv.Deadline() != at(11*wait) {
		t.Fatalf("server start: deadline %v, %v", srv.Deadline().Sub(t0), err)
	}
	_ = srv.Complete(&verbs.WC{ID: RecvWRID, Imm: 4, Flags: verbs.WCWithImm}, at(time.Second), nil)
	if srv.Deadline() != at(time.Second+7*wait) {
		t.Fatalf("server after request 4 of 10: deadline %v", srv.Deadline().Sub(t0))
	}
}

// TestDatagramsFailures: a SEND that does not complete within the wait
// is an error, not a loss; receives are topped up as the tools do, and a
// short post is an error; a wait of zero is refused.
func TestDatagramsFailures(t *testing.T) {
	now := time.Unix(1000, 0)
	d, _ := NewDatagrams(&fakeSeqQueues{room: 100}, true, 3, 4, time.Millisecond)
	_ = d.Start(now)
	if err := d.Expire(now.Add(time.Millisecond)); !errors.Is(err, ErrStuck) {
		t.Errorf("client expiring with its SEND outstanding: %v, want ErrStuck", err)
	}
	if _, err := NewDatagrams(&fakeSeqQueues{room: 3}, true, 3, 4, time.Millisecond); !errors.Is(err, ErrPost) {
		t.Errorf("short initial post: %v", err)
	}
	q := &fakeSeqQueues{room: 7}
	d, _ = NewDatagrams(q, false, 10, 4, time.Millisecond)
	_ = d.Start(now)
	for i := uint32(1); i <= 6; i++ {
		err := d.Complete(&verbs.WC{ID: RecvWRID, Imm: i, Flags: verbs.WCWithImm}, now, nil)
		if (i == 6) != errors.Is(err, ErrPost) {
			t.Errorf("receive %d: %v; want ErrPost at the sixth only (topped up after the third, short of room after the sixth)", i, err)
		}
		_ = d.Complete(&verbs.WC{ID: SendWRID}, now, nil)
	}
	if fmt.Sprint(q.recvs) != "[4 3 0]" {
		t.Errorf("receive posts %v, want [4 3 0]", q.recvs)
	}
	if _, err := NewDatagrams(&fakeSeqQueues{room: 10}, true, 3, 4, 0); !errors.Is(err, ErrUsage) {
		t.Errorf("wait 0: %v", err)
	}
}
