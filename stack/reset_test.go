package stack

import (
	"context"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"
)

// A reset of either end of a relay reaches the other end as a reset, and
// the result says which end reset.
func TestRelayPassesResetsOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{
		{"upstream resets", ErrUpstreamReset},
		{"sandbox resets", ErrSandboxReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, sandbox := tcpPair(t)  // the sandbox's client and tunwall's side of it
			upstream, server := tcpPair(t) // tunwall's upstream socket and the server
			res := make(chan RelayResult, 1)
			go func() { res <- relayTCPConns(context.Background(), sandbox, upstream, 0) }()
			// Some bytes each way first, so that the relay is under way.
			if _, err := server.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(client, buf); err != nil {
				t.Fatal(err)
			}
			aborter, other := server, client
			if tc.want == ErrSandboxReset {
				aborter, other = client, server
			}
			aborter.SetLinger(0)
			aborter.Close()
			other.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err := other.Read(buf)
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the other end read %v, want ECONNRESET", err)
			}
			select {
			case r := <-res:
				if !errors.Is(r.Err, tc.want) || !IsReset(r.Err) {
					t.Errorf("relay ended with %v, want %v", r.Err, tc.want)
				}
				if r.In != 5 {
					t.Errorf("relay counted %d bytes in, want 5", r.In)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the relay did not end")
			}
		})
	}
}

// A clean close stays a clean close.
func TestRelayPassesFINOn(t *testing.T) {
	client, sandbox := tcpPair(t)
	upstream, server := tcpPair(t)
	res := make(chan RelayResult, 1)
	go func() { res <- relayTCPConns(context.Background(), sandbox, upstream, 0) }()
	server.Write([]byte("bye"))
	server.Close()
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "bye" {
		t.Errorf("client read %q, %v; want \"bye\" and EOF", got, err)
	}
	client.Close()
	if r := <-res; r.Err != nil {
		t.Errorf("relay ended with %v, want nil", r.Err)
	}
}

func TestNewSYN(t *testing.T) {
	syn := make([]byte, 20)
	syn[0], syn[1], syn[2], syn[3] = 0x30, 0x39, 0x00, 0x50 // 12345 -> 80
	syn[12] = 5 << 4
	for _, tc := range []struct {
		flags byte
		ok    bool
	}{{0x02, true}, {0x12, false}, {0x10, false}, {0x04, false}, {0x06, false}, {0x01, false}} {
		syn[13] = tc.flags
		sp, dp, ok := newSYN(syn)
		if ok != tc.ok || ok && (sp != 12345 || dp != 80) {
			t.Errorf("flags %#x: got %d %d %v, want ok %v", tc.flags, sp, dp, ok, tc.ok)
		}
	}
	if _, _, ok := newSYN(syn[:19]); ok {
		t.Error("a truncated header was taken for a SYN")
	}
}
