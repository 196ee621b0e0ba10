package appliance

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The transmit queue lets whoever builds frames (a transport engine) go on
// building while a goroutine of the port writes the previous batch: on a
// TAP, a write carries each frame through the whole kernel path (bridge,
// veth, the receiving TAP) before it returns, so writing on the builder's
// goroutine would leave the other core idle.

// txQueueLen is how many batches may wait for the port's writer.
const txQueueLen = 64

// txInlineBytes is the most a batch may carry to be written at once, on
// the caller's goroutine, when nothing waits in the queue: a small batch
// (an acknowledgement, a short message) is then not delayed by a handoff.
// On one P every batch is: the writer would only run when the caller —
// a blocking loop that holds the P until it sleeps — gave it the P. So is
// every batch a blocking loop sends (PortConfig.Loop): the loop's thread
// never gives its P to the writer, which then runs on another processor,
// where its copy of each frame into the kernel reads the frame from the
// loop's processor's cache (docs/performance-log.md, txInlineBytes).
const txInlineBytes = 16 << 10

// txItem is one batch waiting for the writer.
type txItem struct {
	bufs   [][]byte
	offset int
	done   func()
}

// txQueue is the port's asynchronous transmit state.
type txQueue struct {
	items  chan txItem
	busy   atomic.Int32 // batches queued or being written
	mu     sync.RWMutex // held shared by senders, exclusively to close
	closed bool
	merged [][]byte // the writer's batch of several queued batches
	dones  []func()
}

// SendAsync transmits frames bufs[i][offset:] like Send, but may return
// before they are written; done is called once they are written or
// dropped, after which the caller may reuse the buffers. Frames of
// successive calls leave in order. A small batch is written at once when
// nothing is queued; a port that is closing drops the frames and calls
// done.
func (p *Port) SendAsync(bufs [][]byte, offset int, done func()) {
	q := &p.txq
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		done()
		return
	}
	if q.busy.Load() == 0 && (p.inlineAll || batchBytes(bufs, offset) <= txInlineBytes || runtime.GOMAXPROCS(0) == 1) {
		_ = p.Send(bufs, offset)
		done()
		return
	}
	q.busy.Add(1)
	select {
	case q.items <- txItem{bufs: bufs, offset: offset, done: done}:
	case <-p.done:
		q.busy.Add(-1)
		done()
	}
}

func batchBytes(bufs [][]byte, offset int) int {
	n := 0
	for _, b := range bufs {
		n += len(b) - offset
	}
	return n
}

// txMerge is how many queued batches the writer joins into one Send, so
// that a super-frame can span the batches of one message.
const txMerge = 4

// writeLoop writes the queued batches until the port closes, then drops
// what is left.
func (p *Port) writeLoop() {
	defer p.wg.Done()
	q := &p.txq
	for {
		var it txItem
		select {
		case it = <-q.items:
		case <-p.done:
			q.mu.Lock()
			q.closed = true
			q.mu.Unlock()
			for {
				select {
				case it := <-q.items:
					it.done()
					q.busy.Add(-1)
				default:
					return
				}
			}
		}
		// Join what else is queued with the same offset.
		q.merged = append(q.merged[:0], it.bufs...)
		q.dones = append(q.dones[:0], it.done)
		n := 1
	join:
		for n < txMerge {
			select {
			case next := <-q.items:
				if next.offset != it.offset {
					_ = p.Send(q.merged, it.offset)
					p.releaseWritten(n)
					q.merged = append(q.merged[:0], next.bufs...)
					q.dones = append(q.dones[:0], next.done)
					it, n = next, 1
					continue
				}
				q.merged = append(q.merged, next.bufs...)
				q.dones = append(q.dones, next.done)
				n++
			default:
				break join
			}
		}
		_ = p.Send(q.merged, it.offset)
		p.releaseWritten(n)
	}
}

// releaseWritten calls the done functions of the n batches just written.
func (p *Port) releaseWritten(n int) {
	q := &p.txq
	for i, d := range q.dones {
		d()
		q.dones[i] = nil
	}
	q.dones = q.dones[:0]
	for i := range q.merged {
		q.merged[i] = nil
	}
	q.busy.Add(-int32(n))
}
