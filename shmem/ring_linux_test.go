//go:build linux

package shmem

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sharedRing creates a region holding a ring and maps it a second time, so
// the producer and consumer handles see the ring at different addresses, as
// two processes would.
func sharedRing(t testing.TB, slots, slotSize int) (prod, cons *Ring) {
	t.Helper()
	reg, err := NewRegion("ring", RingBytes(slots, slotSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	reg2, err := MapRegion(dupFd(t, reg.Fd()), reg.Size())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg2.Close() })
	if prod, err = InitRing(reg.Bytes(), slots, slotSize); err != nil {
		t.Fatal(err)
	}
	if cons, err = AttachRing(reg2.Bytes()); err != nil {
		t.Fatal(err)
	}
	return prod, cons
}

func TestRingTwoMappings(t *testing.T) {
	for _, g := range []struct{ slots, size int }{{1, 16}, {2, 16}, {16, 32}, {256, 8}} {
		t.Run(fmt.Sprintf("%dx%d", g.slots, g.size), func(t *testing.T) {
			prod, cons := sharedRing(t, g.slots, g.size)
			pumpRing(t, prod, cons, 20000)
		})
	}
}

// awaitFilled blocks until the consumer's ring has a filled slot, sleeping on
// db with the lost-wake-up-free protocol. It returns how many times it slept.
func awaitFilled(ctx context.Context, r *Ring, db *Doorbell) (sleeps int, err error) {
	for r.Len() == 0 {
		if err := r.Err(); err != nil {
			return sleeps, err
		}
		r.PrepareSleep()
		if r.Len() > 0 {
			r.CancelSleep()
			break
		}
		sleeps++
		if err := db.Wait(ctx); err != nil {
			return sleeps, err
		}
	}
	return sleeps, nil
}

// awaitFree is awaitFilled for a producer waiting for space.
func awaitFree(ctx context.Context, r *Ring, db *Doorbell) (sleeps int, err error) {
	for r.Free() == 0 {
		if err := r.Err(); err != nil {
			return sleeps, err
		}
		r.PrepareSpaceWait()
		if r.Free() > 0 {
			r.CancelSpaceWait()
			break
		}
		sleeps++
		if err := db.Wait(ctx); err != nil {
			return sleeps, err
		}
	}
	return sleeps, nil
}

// TestRingSleepWake runs producer and consumer with random pauses so that
// both keep falling asleep, and fails if any wake-up is lost (a Wait that
// runs into the test's deadline).
func TestRingSleepWake(t *testing.T) {
	for _, slots := range []int{1, 4} {
		t.Run(fmt.Sprint(slots), func(t *testing.T) {
			checkNoFdLeak(t)
			prod, cons := sharedRing(t, slots, 16)
			dataBell, err := NewDoorbell()
			if err != nil {
				t.Fatal(err)
			}
			defer dataBell.Close()
			spaceBell, err := NewDoorbell()
			if err != nil {
				t.Fatal(err)
			}
			defer spaceBell.Close()

			const n = 15000
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			pause := func(rng *rand.Rand) {
				switch rng.IntN(16) {
				case 0:
					time.Sleep(time.Duration(rng.IntN(20)) * time.Microsecond)
				case 1, 2:
					for range rng.IntN(500) {
						_ = rng.Uint64()
					}
				}
			}
			var prodSleeps, consSleeps int
			var prodErr atomic.Value
			var wg sync.WaitGroup
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(5, 6))
				for seq := range uint64(n) {
					s, err := awaitFree(ctx, prod, spaceBell)
					prodSleeps += s
					if err != nil {
						prodErr.Store(fmt.Errorf("producer at %d: %w", seq, err))
						return
					}
					binary.LittleEndian.PutUint64(prod.Reserve(), seq)
					if prod.Commit() {
						if err := dataBell.Ring(); err != nil {
							prodErr.Store(err)
							return
						}
					}
					pause(rng)
				}
			})
			rng := rand.New(rand.NewPCG(7, 8))
			for seq := range uint64(n) {
				s, err := awaitFilled(ctx, cons, dataBell)
				consSleeps += s
				if err != nil {
					t.Errorf("consumer at %d (lost wake-up?): %v", seq, err)
					break
				}
				if got := binary.LittleEndian.Uint64(cons.Peek()); got != seq {
					t.Errorf("got message %d, want %d", got, seq)
					break
				}
				if cons.Release() {
					if err := spaceBell.Ring(); err != nil {
						t.Fatal(err)
					}
				}
				pause(rng)
			}
			if t.Failed() {
				cancel()
			}
			wg.Wait()
			if err, _ := prodErr.Load().(error); err != nil {
				t.Fatalf("%v (lost wake-up?)", err)
			}
			t.Logf("%d messages, consumer slept %d times, producer %d times", n, consSleeps, prodSleeps)
			if consSleeps == 0 || prodSleeps == 0 {
				t.Errorf("the sleep paths were not exercised: consumer %d, producer %d", consSleeps, prodSleeps)
			}
		})
	}
}
