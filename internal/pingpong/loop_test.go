package pingpong

import (
	"errors"
	"strings"
	"testing"
)

// fakeQueues records the loop's posts; room limits the receives accepted.
type fakeQueues struct {
	sends, recvs []int
	room         int
	sendErr      error
}

func (f *fakeQueues) PostSend() error {
	f.sends = append(f.sends, 1)
	return f.sendErr
}

func (f *fakeQueues) PostRecv(n int) int {
	n = min(n, f.room)
	f.room -= n
	f.recvs = append(f.recvs, n)
	return n
}

// TestLoop: the tools' rules — receives topped up to rx_depth once one or
// fewer remain, the next SEND only after both the previous SEND and a
// receive completed, the server never first.
func TestLoop(t *testing.T) {
	q := &fakeQueues{room: 1 << 30}
	l, err := NewLoop(q, 3, 4)
	if err != nil || len(q.recvs) != 1 || q.recvs[0] != 4 {
		t.Fatalf("initial posts %v, %v", q.recvs, err)
	}
	if err := l.Start(true); err != nil || len(q.sends) != 1 {
		t.Fatalf("client start: %d sends, %v", len(q.sends), err)
	}
	var got []int
	recv := func(n int) error { got = append(got, n); return nil }
	// The receive first: no SEND until the SEND completes too.
	steps := []struct {
		id        uint64
		sends     int
		recvPosts []int
	}{
		{RecvWRID, 1, []int{4}},
		{SendWRID, 2, []int{4}},
		{SendWRID, 2, []int{4}},
		{RecvWRID, 3, []int{4}},
		{RecvWRID, 3, []int{4, 3}}, // three of four used: one left, topped up by three
		{SendWRID, 3, []int{4, 3}}, // the third SEND: no fourth
	}
	for i, s := range steps {
		if err := l.Complete(s.id, recv); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if len(q.sends) != s.sends || !equal(q.recvs, s.recvPosts) {
			t.Fatalf("step %d: %d sends, receive posts %v; want %d, %v", i, len(q.sends), q.recvs, s.sends, s.recvPosts)
		}
	}
	if !l.Done() || l.Sent != 3 || l.Received != 3 || !equal(got, []int{1, 2, 3}) {
		t.Fatalf("done %v, sent %d, received %d, receive callbacks %v", l.Done(), l.Sent, l.Received, got)
	}

	// A server waits for the first receive.
	q = &fakeQueues{room: 1 << 30}
	l, _ = NewLoop(q, 1, 2)
	if err := l.Start(false); err != nil || len(q.sends) != 0 {
		t.Fatalf("server start: %d sends, %v", len(q.sends), err)
	}
	if err := l.Complete(RecvWRID, nil); err != nil || len(q.sends) != 1 {
		t.Fatalf("server echo: %d sends, %v", len(q.sends), err)
	}

	// Failures, in the tools' words.
	if _, err := NewLoop(&fakeQueues{room: 3}, 1, 4); !errors.Is(err, ErrPost) || !strings.Contains(err.Error(), "couldn't post receive (3)") {
		t.Errorf("short initial post: %v", err)
	}
	q = &fakeQueues{room: 2}
	l, _ = NewLoop(q, 5, 2)
	if err := l.Complete(RecvWRID, nil); !errors.Is(err, ErrPost) {
		t.Errorf("short top-up: %v", err)
	}
	l, _ = NewLoop(&fakeQueues{room: 10, sendErr: errors.New("full")}, 5, 2)
	if err := l.Start(true); !errors.Is(err, ErrPost) || !strings.Contains(err.Error(), "couldn't post send") {
		t.Errorf("failed send: %v", err)
	}
	l, _ = NewLoop(&fakeQueues{room: 10}, 5, 2)
	if err := l.Complete(7, nil); err == nil || err.Error() != "completion for unknown wr_id 7" {
		t.Errorf("unknown wr_id: %v", err)
	}
	if err := StatusError("transport retry counter exceeded", 12, 2); err.Error() != "failed status transport retry counter exceeded (12) for wr_id 2" {
		t.Errorf("status error: %v", err)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
