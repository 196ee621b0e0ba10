package pingpong

import (
	"errors"
	"fmt"
	"time"

	"github.com/taproce/taproce/verbs"
)

// SeqQueues is what the bounded exchange loop needs of one side: posting a
// SEND of the message that carries a sequence number as its immediate
// data, and posting receives into the buffer.
type SeqQueues interface {
	// PostSendSeq posts one signalled SEND with immediate data seq and
	// SendWRID.
	PostSendSeq(seq uint32) error
	// PostRecv posts up to n receives with RecvWRID and returns how many
	// it posted.
	PostRecv(n int) int
}

// ErrStuck is wrapped by the bounded loop's error for a SEND that did not
// complete within the wait: a UD SEND completes locally, lost or not, so
// one that does not is a broken device, not a lost datagram.
var ErrStuck = errors.New("pingpong: SEND did not complete")

// Datagrams is the exchange loop of a UD pingpong that waits a bounded
// time for each datagram (--timeout), for links that lose datagrams, as
// UD never retransmits. ibv_ud_pingpong's loop waits for ever for a
// receive that was lost; this one counts it as lost instead, so a lossy
// link costs one wait per loss rather than the whole run.
//
// The client drives it: it sends request k (k = 1…iters, the sequence
// number carried as immediate data) and waits up to the wait for the
// answer that echoes k; when none comes, the round trip is lost and it
// sends k+1. Answers to earlier requests (late ones) and duplicates are
// ignored, so every round trip is counted once whatever the link
// reorders or duplicates. The server answers each request newer than the
// last it answered, echoing its number, and ignores the others; it ends
// with request iters, or when no request came for as long as the client
// can take for the ones left (one wait each, plus one). A datagram
// without immediate data — a peer running plain ibv_ud_pingpong — counts
// as the next one.
//
// Every lost round trip lost exactly one datagram (a lost request is
// never answered), so the client's Lost is the number of datagrams lost,
// or later than the wait, in both directions together.
type Datagrams struct {
	q                     SeqQueues
	client                bool
	iters, rxDepth, routs int
	wait                  time.Duration
	deadline              time.Time
	// seq is, on the client, the request in flight (0 before the first);
	// on the server, the last request answered.
	seq uint32
	// awaiting is set on the client from a request's SEND to its answer
	// or its deadline.
	awaiting bool
	// sending is set from a SEND's post to its completion: the send queue
	// holds one.
	sending bool
	// queued is a server's answer waiting for the send queue (0: none).
	queued uint32
	// expired is set on a server whose wait for requests ended.
	expired bool
	// Sent counts completed SENDs, Received the receives that counted
	// (answers to the request in flight; new requests), Ignored the others
	// (late answers, duplicates, old requests).
	Sent, Received, Ignored int
}

// NewDatagrams posts rxDepth receives, as the tools do before the
// exchange, for a side that waits at most wait for each datagram.
func NewDatagrams(q SeqQueues, client bool, iters, rxDepth int, wait time.Duration) (*Datagrams, error) {
	if wait <= 0 {
		return nil, fmt.Errorf("%w: wait %v for each datagram: want more than 0", ErrUsage, wait)
	}
	d := &Datagrams{q: q, client: client, iters: iters, rxDepth: rxDepth, wait: wait}
	d.routs = q.PostRecv(rxDepth)
	if d.routs < rxDepth {
		return nil, fmt.Errorf("%w: couldn't post receive (%d)", ErrPost, d.routs)
	}
	return d, nil
}

// Start begins the exchange at now: the client sends its first request,
// the server starts waiting for it.
func (d *Datagrams) Start(now time.Time) error {
	if d.client {
		return d.next(now)
	}
	d.deadline = now.Add(d.serverWait())
	return nil
}

// serverWait is how long a server waits for the next request: the
// client takes at most one wait (and a round trip) per request left
// before it sends the next, so one wait more than that covers it.
func (d *Datagrams) serverWait() time.Duration {
	return time.Duration(d.iters-int(d.seq)+1) * d.wait
}

// Deadline is when the current wait ends; the caller calls Expire then,
// if no completion came before.
func (d *Datagrams) Deadline() time.Time { return d.deadline }

// Done reports whether the side has finished: the client with every
// request answered or given up, the server with the last request answered
// or its wait ended, and no SEND outstanding on either.
func (d *Datagrams) Done() bool {
	if d.sending || d.queued != 0 {
		return false
	}
	if d.client {
		return int(d.seq) >= d.iters && !d.awaiting
	}
	return int(d.seq) >= d.iters || d.expired
}

// Lost is the number of datagrams the side did not get: on the client
// the requests not answered in time (one datagram lost each, in either
// direction), on the server the requests that never came.
func (d *Datagrams) Lost() int { return d.iters - d.Received }

// Complete handles the successful completion wc at now. A receive that
// counts is passed to received (when not nil) with its number, from 1,
// before the next SEND can overwrite the buffer.
func (d *Datagrams) Complete(wc *verbs.WC, now time.Time, received func(n int) error) error {
	switch wc.ID {
	case SendWRID:
		d.Sent++
		d.sending = false
		if d.queued != 0 {
			seq := d.queued
			d.queued = 0
			return d.post(seq)
		}
		if d.client {
			return d.next(now)
		}
		return nil
	case RecvWRID:
	default:
		return fmt.Errorf("completion for unknown wr_id %d", int(wc.ID))
	}
	d.routs--
	if d.routs <= 1 {
		d.routs += d.q.PostRecv(d.rxDepth - d.routs)
		if d.routs < d.rxDepth {
			return fmt.Errorf("%w: couldn't post receive (%d)", ErrPost, d.routs)
		}
	}
	seq, numbered := wc.Imm, wc.Flags&verbs.WCWithImm != 0
	if d.client {
		if !d.awaiting || numbered && seq != d.seq {
			d.Ignored++
			return nil
		}
		d.awaiting = false
		d.Received++
		if received != nil {
			if err := received(d.Received); err != nil {
				return err
			}
		}
		return d.next(now)
	}
	if !numbered {
		seq = d.seq + 1
	}
	if d.expired || seq <= d.seq || int(seq) > d.iters {
		d.Ignored++
		return nil
	}
	d.seq = seq
	d.Received++
	d.deadline = now.Add(d.serverWait())
	if received != nil {
		if err := received(d.Received); err != nil {
			return err
		}
	}
	if d.sending {
		d.queued = seq // the answer to a request lost earlier is still going out
		return nil
	}
	return d.post(seq)
}

// Expire ends the current wait at now: on the client the request in
// flight is lost and the next goes out; on the server no more requests
// are waited for. A SEND still outstanding then is ErrStuck.
func (d *Datagrams) Expire(now time.Time) error {
	if d.sending {
		return fmt.Errorf("%w within %v", ErrStuck, d.wait)
	}
	if !d.client {
		d.expired = true
		return nil
	}
	d.awaiting = false
	return d.next(now)
}

// next sends the client's next request, if the one in flight is answered
// or lost, its SEND completed, and requests are left.
func (d *Datagrams) next(now time.Time) error {
	if d.awaiting || d.sending || int(d.seq) >= d.iters {
		return nil
	}
	d.seq++
	d.awaiting = true
	d.deadline = now.Add(d.wait)
	return d.post(d.seq)
}

func (d *Datagrams) post(seq uint32) error {
	if err := d.q.PostSendSeq(seq); err != nil {
		return fmt.Errorf("%w: couldn't post send: %w", ErrPost, err)
	}
	d.sending = true
	return nil
}
