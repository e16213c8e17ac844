package main

import (
	"context"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
)

// fakeCommand records what forward does to the sandbox's command.
type fakeCommand struct{ got []string }

func (f *fakeCommand) Signal(sig os.Signal) { f.got = append(f.got, sig.String()) }
func (f *fakeCommand) Kill()                { f.got = append(f.got, "kill") }

func TestRunForwardsEverySignalButKillsAtTheSecondSIGTERM(t *testing.T) {
	var s frontSignals
	var cmd fakeCommand
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGINT, syscall.SIGTERM} {
		s.forward(sig, &cmd)
	}
	want := []string{"interrupt", "terminated", "hangup", "quit", "kill", "interrupt", "kill"}
	if !slices.Equal(cmd.got, want) {
		t.Errorf("forwarded %q, want %q", cmd.got, want)
	}
}

func TestACaughtSignalWaitsAndTheFirstStopsTheContextOnce(t *testing.T) {
	s := catchSignals(stopSignals)
	defer s.release()
	// Caught before anyone reads: it waits in C, and tunwall lives on.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	said := make(chan os.Signal, 4)
	ctx, cancel := s.stopContext(context.Background(), func(sig os.Signal) { said <- sig })
	defer cancel()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context was not cancelled within 10s of SIGHUP")
	}
	if sig := <-said; sig != syscall.SIGHUP {
		t.Errorf("said %v, want SIGHUP", sig)
	}
	// A second signal is caught, and ignored: nothing more is said.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case sig := <-s.C:
		if sig != syscall.SIGTERM {
			t.Errorf("caught %v, want SIGTERM", sig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM was not caught within 10s")
	}
	if len(said) != 0 {
		t.Errorf("said %v after the first signal", <-said)
	}
}
