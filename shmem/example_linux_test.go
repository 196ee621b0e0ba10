//go:build linux

package shmem_test

import (
	"context"
	"fmt"

	"github.com/taproce/taproce/shmem"
)

// Example shows one producer and one consumer sharing a ring through a
// region, and the doorbell protocol for a consumer that goes to sleep. In
// real use the two sides live in different processes: the region's and the
// doorbell's descriptors travel with SendMsg, the peer maps them with
// MapRegion and DoorbellFromFd and attaches with AttachRing.
func Example() {
	reg, err := shmem.NewRegion("example", shmem.RingBytes(8, 64))
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	bell, err := shmem.NewDoorbell()
	if err != nil {
		panic(err)
	}
	defer bell.Close()
	prod, err := shmem.InitRing(reg.Bytes(), 8, 64)
	if err != nil {
		panic(err)
	}
	cons, err := shmem.AttachRing(reg.Bytes())
	if err != nil {
		panic(err)
	}

	// The consumer finds the ring empty and prepares to sleep.
	cons.PrepareSleep()
	if cons.Len() > 0 {
		cons.CancelSleep()
	}

	// The producer publishes a message; Commit says the consumer sleeps.
	slot := prod.Reserve()
	copy(slot, "hello")
	if prod.Commit() {
		bell.Ring()
	}

	// The consumer waits, then reads.
	if err := bell.Wait(context.Background()); err != nil {
		panic(err)
	}
	msg := cons.Peek()
	fmt.Printf("%s\n", msg[:5])
	cons.Release()
	fmt.Println(cons.Len(), prod.Free(), cons.Err())
	// Output:
	// hello
	// 0 8 <nil>
}
