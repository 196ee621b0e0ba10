package cpulist

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Set
		out  string
	}{
		{"0", Of(0), "0"},
		{"3", Of(3), "3"},
		{"0-3", Of(0, 1, 2, 3), "0-3"},
		{"0-3,6", Of(0, 1, 2, 3, 6), "0-3,6"},
		{" 1 , 5-6 ", Of(1, 5, 6), "1,5-6"},
		{"7,0", Of(0, 7), "0,7"},
		{"2-2", Of(2), "2"},
		{"0-1,1-2", Of(0, 1, 2), "0-2"},
		{"1023", Of(1023), "1023"},
		{"010", Of(10), "10"},
	} {
		got, err := Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Parse(%q) = %q, want %q", tc.in, Format(got), Format(tc.want))
		}
		if f := Format(got); f != tc.out {
			t.Errorf("Format(Parse(%q)) = %q, want %q", tc.in, f, tc.out)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{"", " ", ",", "1,", "a", "-1", "1-", "-", "3-1", "1024", "0-1024", "1.5", "1-2-3", "+1", "99999999999999999999"} {
		if s, err := Parse(in); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) = %q, %v; want an error wrapping ErrSyntax", in, Format(s), err)
		}
	}
}

func TestSetOps(t *testing.T) {
	a, b := Of(0, 1, 2, 5), Of(1, 5, 9)
	if got := Without(a, b); got != Of(0, 2) {
		t.Errorf("Without = %q", Format(got))
	}
	if Subset(a, b) || !Subset(Of(1, 5), b) || !Subset(Set{}, a) {
		t.Error("Subset wrong")
	}
	if Format(Set{}) != "" {
		t.Error("Format of the empty set")
	}
	if got := List(Of(7, 0, 3)); len(got) != 3 || got[0] != 0 || got[1] != 3 || got[2] != 7 {
		t.Errorf("List = %v", got)
	}
}

// masks returns the mask of every thread of the process.
func masks(t *testing.T) map[int]Set {
	t.Helper()
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]Set{}
	for _, tid := range tids {
		var s Set
		if err := unix.SchedGetaffinity(tid, &s); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue // gone meanwhile
			}
			t.Fatal(err)
		}
		out[tid] = s
	}
	return out
}

// lockThreads makes n goroutines wired to threads of their own, which
// forces the runtime to make threads, and returns how to let them go. The
// goroutines end still wired, which ends their threads too.
func lockThreads(t *testing.T, n int, check func(Set)) (release func()) {
	t.Helper()
	var ready, done sync.WaitGroup
	stop := make(chan struct{})
	for range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			var s Set
			if err := unix.SchedGetaffinity(0, &s); err != nil {
				t.Error(err)
			}
			check(s)
			ready.Done()
			<-stop
		}()
	}
	ready.Wait()
	return func() { close(stop); done.Wait() }
}

func TestPin(t *testing.T) {
	allowed, err := Allowed()
	if err != nil {
		t.Fatal(err)
	}
	// The last processor the test may use.
	all := List(allowed)
	one := Of(all[len(all)-1])
	release := lockThreads(t, 2, func(Set) {})
	defer release()
	restore, err := Pin(one)
	if err != nil {
		t.Fatal(err)
	}
	for tid, s := range masks(t) {
		if s != one {
			t.Errorf("thread %d runs on %q after Pin(%q)", tid, Format(s), Format(one))
		}
	}
	// Threads made after Pin inherit the mask: more goroutines wired to
	// threads than there are threads make some.
	before := len(masks(t))
	releaseNew := lockThreads(t, before+1, func(s Set) {
		if s != one {
			t.Errorf("a thread made after Pin runs on %q", Format(s))
		}
	})
	if after := len(masks(t)); after <= before {
		t.Errorf("no new thread was made (%d before, %d after)", before, after)
	}
	for tid, s := range masks(t) {
		if s != one {
			t.Errorf("thread %d runs on %q", tid, Format(s))
		}
	}
	releaseNew()
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	for tid, s := range masks(t) {
		if s != allowed {
			t.Errorf("thread %d runs on %q after restore, want %q", tid, Format(s), Format(allowed))
		}
	}
}

func TestPinRefuses(t *testing.T) {
	allowed, err := Allowed()
	if err != nil {
		t.Fatal(err)
	}
	outside := Without(Of(Max-1), allowed)
	if outside.Count() == 0 {
		t.Skip("this process may run on the highest processor number")
	}
	for _, s := range []Set{{}, outside} {
		if _, err := Pin(s); !errors.Is(err, ErrNotAllowed) {
			t.Errorf("Pin(%q): %v, want ErrNotAllowed", Format(s), err)
		}
	}
	after, err := Allowed()
	if err != nil || after != allowed {
		t.Errorf("a refused Pin changed the mask to %q (%v)", Format(after), err)
	}
}

// FuzzParse: Parse never panics, and what it accepts Format writes back
// as an equal set.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "0-3,6", " 1 , 5-6 ", "3-1", "", "1024", "0-1023", "1,,2", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q): %v does not wrap ErrSyntax", s, err)
			}
			return
		}
		if set.Count() == 0 {
			t.Fatalf("Parse(%q) accepted an empty set", s)
		}
		again, err := Parse(Format(set))
		if err != nil || again != set {
			t.Fatalf("Parse(Format(Parse(%q))) = %q, %v", s, Format(again), err)
		}
	})
}
