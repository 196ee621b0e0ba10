package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/taproce/taproce/verbs"
)

// runRDMADemo is `taproce rdma-demo [flags] listen|dial ADDR`: two
// applications, one listening and one dialing, connect with the verbs
// connection helper and each checks the other's RDMA:
//
//  1. each side exposes a region: SIZE bytes of its own random data, which
//     the peer READs, then SIZE bytes the peer WRITEs into, then an 8-byte
//     counter the peer increments with FETCH_ADD; the regions and the
//     SHA-256 of the data to be read are exchanged as messages;
//  2. each side WRITEs SIZE random bytes into the peer's region, READs the
//     peer's data back and compares its SHA-256, and adds 1 to the peer's
//     counter (whose value before must be 0);
//  3. each side sends the SHA-256 of what it wrote; the receiver compares
//     it with what arrived in its region, and checks its counter is 1;
//  4. each side sends its verdict, so that both learn whether the other
//     saw its data intact.
//
// It prints "LISTENING ADDR" once the listener accepts connections, and
// a last line "RESULT ok …" or "RESULT error …". The exit status is 0 when
// both sides checked everything, 1 otherwise, 2 for a wrong command line.
// The appliance's socket is $TAPROCE_SOCKET (default
// /run/taproce/taproce.sock).
func runRDMADemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rdma-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	size := fs.Int("size", 1<<20, "`bytes` each side writes and reads (a multiple of 8, at most 1 GiB)")
	device := fs.String("device", "", "the device `name` (default: the first this process may use)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this `duration`")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce rdma-demo [flags] listen|dial ADDR")
		fmt.Fprintln(stderr, "\nTwo applications check each other's RDMA WRITE, READ and FETCH_ADD. Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 2 || (fs.Arg(0) != "listen" && fs.Arg(0) != "dial") || *size <= 0 || *size%8 != 0 || *size > 1<<30 {
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var opts []verbs.ConnOption
	if *device != "" {
		opts = append(opts, verbs.WithDevice(*device))
	}
	conn, err := demoConnect(ctx, fs.Arg(0), fs.Arg(1), stdout, opts)
	if err != nil {
		fmt.Fprintf(stdout, "RESULT error %v\n", err)
		return 1
	}
	defer conn.Close()
	rep, err := demoExchange(ctx, conn, *size)
	if err != nil {
		fmt.Fprintf(stdout, "RESULT error %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "RESULT ok peer=%s bytes=%d write=%.1fMB/s read=%.1fMB/s sha256-written=%s sha256-read=%s\n",
		conn.RemoteAddr(), *size, rate(*size, rep.write), rate(*size, rep.read), rep.written[:16], rep.readBack[:16])
	return 0
}

// demoConnect listens on addr and accepts one peer, or dials addr.
func demoConnect(ctx context.Context, role, addr string, stdout io.Writer, opts []verbs.ConnOption) (*verbs.Conn, error) {
	if role == "dial" {
		return verbs.Dial(ctx, addr, opts...)
	}
	ln, err := verbs.Listen(ctx, "tcp", addr, opts...)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	fmt.Fprintf(stdout, "LISTENING %s\n", ln.Addr())
	return ln.Accept(ctx)
}

// demoReport is what one side measured and checked.
type demoReport struct {
	write, read       time.Duration // how long the WRITE and the READ took
	written, readBack string        // SHA-256 of the data written and read, in hex
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds() / 1e6
}

// demoExchange runs the checks of runRDMADemo on an established
// connection.
func demoExchange(ctx context.Context, conn *verbs.Conn, n int) (demoReport, error) {
	var rep demoReport
	access := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	exposed, err := conn.AllocMR(ctx, 2*n+8, access)
	if err != nil {
		return rep, fmt.Errorf("exposed region: %w", err)
	}
	own := exposed.Bytes()[:n]
	if _, err := rand.Read(own); err != nil {
		return rep, err
	}
	ownSum := sha256.Sum256(own)
	if err := conn.SendMR(ctx, exposed, access); err != nil {
		return rep, fmt.Errorf("sending the region: %w", err)
	}
	remote, err := conn.ReceiveMR(ctx)
	if err != nil {
		return rep, fmt.Errorf("receiving the peer's region: %w", err)
	}
	if remote.Len < uint64(2*n+8) {
		return rep, fmt.Errorf("the peer's region has %d bytes, want %d (same -size on both sides)", remote.Len, 2*n+8)
	}
	if err := conn.Send(ctx, []byte("data "+hex.EncodeToString(ownSum[:]))); err != nil {
		return rep, fmt.Errorf("sending the data's hash: %w", err)
	}
	peerSum, err := demoHash(ctx, conn, "data")
	if err != nil {
		return rep, err
	}

	src, err := conn.AllocMR(ctx, n, verbs.AccessLocalWrite)
	if err != nil {
		return rep, fmt.Errorf("source region: %w", err)
	}
	if _, err := rand.Read(src.Bytes()); err != nil {
		return rep, err
	}
	writtenSum := sha256.Sum256(src.Bytes())
	t0 := time.Now()
	if err := conn.Write(ctx, src, 0, n, remote, uint64(n)); err != nil {
		return rep, fmt.Errorf("RDMA WRITE: %w", err)
	}
	rep.write = time.Since(t0)
	dst, err := conn.AllocMR(ctx, n, verbs.AccessLocalWrite)
	if err != nil {
		return rep, fmt.Errorf("destination region: %w", err)
	}
	t0 = time.Now()
	if err := conn.Read(ctx, dst, 0, n, remote, 0); err != nil {
		return rep, fmt.Errorf("RDMA READ: %w", err)
	}
	rep.read = time.Since(t0)
	var failures []string
	if got := sha256.Sum256(dst.Bytes()); got != peerSum {
		failures = append(failures, fmt.Sprintf("READ returned data with SHA-256 %x, the peer has %x", got[:8], peerSum[:8]))
	}
	old, err := conn.FetchAdd(ctx, remote, uint64(2*n), 1)
	if err != nil {
		return rep, fmt.Errorf("FETCH_ADD: %w", err)
	}
	if old != 0 {
		failures = append(failures, fmt.Sprintf("FETCH_ADD found %d in the peer's counter, want 0", old))
	}

	if err := conn.Send(ctx, []byte("wrote "+hex.EncodeToString(writtenSum[:]))); err != nil {
		return rep, fmt.Errorf("sending the written data's hash: %w", err)
	}
	peerWrote, err := demoHash(ctx, conn, "wrote")
	if err != nil {
		return rep, err
	}
	if got := sha256.Sum256(exposed.Bytes()[n : 2*n]); got != peerWrote {
		failures = append(failures, fmt.Sprintf("the peer's WRITE left data with SHA-256 %x, it wrote %x", got[:8], peerWrote[:8]))
	}
	if c := binary.NativeEndian.Uint64(exposed.Bytes()[2*n:]); c != 1 {
		failures = append(failures, fmt.Sprintf("the counter the peer incremented is %d, want 1", c))
	}

	verdict := "ok"
	if len(failures) > 0 {
		verdict = "fail " + strings.Join(failures, "; ")
	}
	if err := conn.Send(ctx, []byte(verdict)); err != nil {
		return rep, fmt.Errorf("sending the verdict: %w", err)
	}
	theirs, err := conn.Recv(ctx)
	if err != nil {
		return rep, fmt.Errorf("receiving the peer's verdict: %w", err)
	}
	if !bytes.Equal(theirs, []byte("ok")) {
		failures = append(failures, "the peer says: "+string(theirs))
	}
	if len(failures) > 0 {
		return rep, errors.New(strings.Join(failures, "; "))
	}
	rep.written, rep.readBack = hex.EncodeToString(writtenSum[:]), hex.EncodeToString(peerSum[:])
	return rep, nil
}

// demoHash receives the message "KIND HEX" and returns the hash in it.
func demoHash(ctx context.Context, conn *verbs.Conn, kind string) ([32]byte, error) {
	var sum [32]byte
	msg, err := conn.Recv(ctx)
	if err != nil {
		return sum, fmt.Errorf("receiving the peer's %s hash: %w", kind, err)
	}
	h, ok := strings.CutPrefix(string(msg), kind+" ")
	b, err := hex.DecodeString(h)
	if !ok || err != nil || len(b) != len(sum) {
		return sum, fmt.Errorf("the peer sent %q, want %q and a SHA-256", msg, kind)
	}
	copy(sum[:], b)
	return sum, nil
}
