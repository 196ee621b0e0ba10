// Package poll is how the appliance waits for work: the one loop (Loop)
// that polls every port's TAP and every client's rings, spinning or
// sleeping in ppoll(2), and the policy of each poll mode (Mode) — how long
// it lingers before it sleeps, how long an acknowledgement may wait for
// company, how many processors it takes. Only the appliance uses it; the
// clients' own busy-polling is internal/spin's.
package poll

import (
	"errors"
	"fmt"
	"runtime"
	"time"
)

// Mode says how the appliance waits for its clients' posts and its ports'
// frames (config poll).
type Mode int

// Poll modes.
const (
	// Adaptive polls briefly after work, then sleeps: one blocking loop
	// (NewBlockingLoop) that lingers Mode.Linger before it sleeps on every
	// port and every client's doorbell.
	Adaptive Mode = iota
	// Block sleeps as soon as the rings and the ports are empty: one
	// blocking loop, as Adaptive, that does not linger.
	Block
	// Spin never sleeps: one loop polls every port and every client's
	// rings (NewLoop).
	Spin
)

// Names lists the modes as ParseMode reads them, the default first.
var Names = []string{"adaptive", "block", "spin"}

// ErrMode is wrapped by ParseMode's error for a name it does not know.
var ErrMode = errors.New("poll mode: want block, spin or adaptive")

// ParseMode reads "block", "spin" or "adaptive" ("" is adaptive).
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "adaptive":
		return Adaptive, nil
	case "block":
		return Block, nil
	case "spin":
		return Spin, nil
	}
	return 0, fmt.Errorf("%w: %q", ErrMode, s)
}

// String returns the mode as ParseMode reads it.
func (m Mode) String() string {
	switch m {
	case Block:
		return "block"
	case Spin:
		return "spin"
	}
	return "adaptive"
}

// adaptiveLinger is how long an adaptive loop keeps polling after its
// last work before it sleeps: 50 µs on a machine with cores to spare;
// none on a smaller one, where a spinning appliance takes the core a
// client needs (BenchmarkLabSpeed on 2 cores: adaptive with 50 µs was
// slower than block).
var adaptiveLinger = func() time.Duration {
	if runtime.NumCPU() >= 4 {
		return 50 * time.Microsecond
	}
	return 0
}()

// Linger is how long a loop of this mode keeps polling after its last
// work before it sleeps: 0 for Block, a short while for Adaptive, forever
// (negative) for Spin.
func (m Mode) Linger() time.Duration {
	switch m {
	case Block:
		return 0
	case Spin:
		return -1
	}
	return adaptiveLinger
}

// AckDelay is how long, in this mode, the transport lets the
// acknowledgement of a message that completed a receive wait for a frame
// to go out with (transport.Config.AckDelay) — time for the client's
// answer to that message, which then leaves in the same write: spinning,
// 10 µs, watched by the spinning loop's ring polls; sleeping, 5 µs, which
// the blocking loop spends polling instead of sleeping (Loop.AddHold), so
// that the answer needs no doorbell (docs/performance-log.md, AckDelay).
func (m Mode) AckDelay() time.Duration {
	if m == Spin {
		return 10 * time.Microsecond
	}
	return 5 * time.Microsecond
}

// Procs is how many of available processors (GOMAXPROCS) the appliance's
// Go code should run on in this mode: all of them when it sleeps for want
// of work; when it spins, half of them, but two where there are two or
// three — the spinning loop's and its helper's, which joins while a stream
// keeps the loop busy and sleeps otherwise. Clients that busy-poll their
// completion queues need the other cores (docs/performance-log.md,
// procs). The config's procs trades back.
func (m Mode) Procs(available int) int {
	if m == Spin {
		return min(available, max(2, available/2))
	}
	return available
}

// New returns the loop of mode m: spinning for Spin, else blocking and
// lingering as m says. Run runs it, Close releases it.
func New(m Mode) (*Loop, error) {
	if m == Spin {
		return NewLoop(), nil
	}
	l, err := NewBlockingLoop()
	if err != nil {
		return nil, err
	}
	l.SetLinger(max(m.Linger(), 0))
	return l, nil
}
