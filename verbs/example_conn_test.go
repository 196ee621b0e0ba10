package verbs_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/taproce/taproce/verbs"
)

// A server offers a region of its memory; a client writes into it, adds
// to a counter in it, and tells the server with a message. The two
// exchange what RDMA needs over TCP. Usually each runs in its own network
// namespace and takes the device of it (no WithDevice); this example runs
// both in one process, on two devices of a running appliance.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var devices []string
	all, err := verbs.Devices(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range all {
		if d.Usable {
			devices = append(devices, d.Name)
		}
	}
	if len(devices) == 0 {
		log.Fatal("no device")
	}
	serverDev, clientDev := devices[0], devices[len(devices)-1]

	ln, err := verbs.Listen(ctx, "tcp", "127.0.0.1:0", verbs.WithDevice(serverDev))
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
		mr, err := conn.AllocMR(ctx, 4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic)
		if err != nil {
			log.Fatal(err)
		}
		if err := conn.SendMR(ctx, mr, verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic); err != nil {
			log.Fatal(err)
		}
		msg, err := conn.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("server: %s: %q, counter %d\n", msg, mr.Bytes()[:11], mr.Bytes()[64])
		if err := conn.Send(ctx, []byte("thanks")); err != nil {
			log.Fatal(err)
		}
		// Wait for the client to close: Recv then fails.
		if _, err := conn.Recv(ctx); err == nil {
			log.Fatal("a message after the last")
		}
	}()

	conn, err := verbs.Dial(ctx, ln.Addr().String(), verbs.WithDevice(clientDev))
	if err != nil {
		log.Fatal(err)
	}
	remote, err := conn.ReceiveMR(ctx)
	if err != nil {
		log.Fatal(err)
	}
	local, err := conn.AllocMR(ctx, 4096, verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	copy(local.Bytes(), "hello, RDMA")
	if err := conn.Write(ctx, local, 0, 11, remote, 0); err != nil {
		log.Fatal(err)
	}
	old, err := conn.FetchAdd(ctx, remote, 64, 3)
	if err != nil {
		log.Fatal(err)
	}
	if err := conn.Send(ctx, []byte("written")); err != nil {
		log.Fatal(err)
	}
	reply, err := conn.Recv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("client: counter was %d, server said %s\n", old, reply)
	conn.Close()
	<-served
}
