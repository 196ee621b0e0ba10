package pingpong

import (
	"errors"
	"fmt"
)

// Work request IDs of the tools.
const (
	RecvWRID = 1
	SendWRID = 2
)

// Queues is what the exchange loop needs of one side: posting the next
// SEND of the message, and posting receives into the buffer.
type Queues interface {
	// PostSend posts one signalled SEND of the message with SendWRID.
	PostSend() error
	// PostRecv posts up to n receives with RecvWRID and returns how many
	// it posted.
	PostRecv(n int) int
}

// ErrPost is wrapped by the loop's errors for a work request that could
// not be posted.
var ErrPost = errors.New("pingpong: post failed")

// Loop is the tools' exchange loop (their main loop and parse_single_wc)
// without the polling: counts of completed SENDs and receives, receive
// credits, and when to post the next SEND.
type Loop struct {
	q              Queues
	iters, rxDepth int
	routs, pending int
	// Sent and Received count the successful completions.
	Sent, Received int
}

// NewLoop posts rxDepth receives, as the tools do before the exchange.
func NewLoop(q Queues, iters, rxDepth int) (*Loop, error) {
	l := &Loop{q: q, iters: iters, rxDepth: rxDepth}
	l.routs = q.PostRecv(rxDepth)
	if l.routs < rxDepth {
		return nil, fmt.Errorf("%w: couldn't post receive (%d)", ErrPost, l.routs)
	}
	return l, nil
}

// Start begins the exchange: the client posts the first SEND.
func (l *Loop) Start(client bool) error {
	l.pending = RecvWRID
	if client {
		if err := l.q.PostSend(); err != nil {
			return fmt.Errorf("%w: couldn't post send: %w", ErrPost, err)
		}
		l.pending |= SendWRID
	}
	return nil
}

// Done reports whether iters SENDs and iters receives completed.
func (l *Loop) Done() bool { return l.Received >= l.iters && l.Sent >= l.iters }

// Complete handles a successful completion of work request id. For a
// receive it tops the receive queue up when one or fewer receives remain
// and calls received (when not nil) with the receive's number, from 1,
// before the next SEND can overwrite the buffer. It then posts the next
// SEND when both the previous SEND and a receive completed.
func (l *Loop) Complete(id uint64, received func(n int) error) error {
	switch id {
	case SendWRID:
		l.Sent++
	case RecvWRID:
		l.routs--
		if l.routs <= 1 {
			l.routs += l.q.PostRecv(l.rxDepth - l.routs)
			if l.routs < l.rxDepth {
				return fmt.Errorf("%w: couldn't post receive (%d)", ErrPost, l.routs)
			}
		}
		l.Received++
		if received != nil {
			if err := received(l.Received); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("completion for unknown wr_id %d", int(id))
	}
	l.pending &^= int(id)
	if l.Sent < l.iters && l.pending == 0 {
		if err := l.q.PostSend(); err != nil {
			return fmt.Errorf("%w: couldn't post send: %w", ErrPost, err)
		}
		l.pending = RecvWRID | SendWRID
	}
	return nil
}

// StatusError is the tools' message for a completion in error.
func StatusError(status string, code int, id uint64) error {
	return fmt.Errorf("failed status %s (%d) for wr_id %d", status, code, int(id))
}
