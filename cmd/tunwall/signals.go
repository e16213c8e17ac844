package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tunwall/tunwall/internal/control"
)

// frontSignals is how every front end (run and bwrap, attach, socks) takes
// the signals that ask tunwall to stop: they are caught from catchSignals
// until release, the front end's return, so that none of them kills
// tunwall half-way (a SIGHUP from a closing terminal included: a log
// without its trailer does not verify). A signal that arrives before the
// front end reads C waits there; one caught while it shuts down is
// ignored. At most frontSignalQueue signals wait; more are dropped, as
// signal.Notify drops them.
type frontSignals struct {
	// C delivers the caught signals, in order.
	C     chan os.Signal
	terms int // the SIGTERMs forward has seen
}

// frontSignalQueue is how many caught signals may wait to be read.
const frontSignalQueue = 8

// stopSignals are what attach and socks stop on; forwardedSignals are what
// run and bwrap pass on to the command (SIGQUIT too: it asks the command
// for a core dump, not tunwall).
var (
	stopSignals      = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}
	forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}
)

// catchSignals starts catching sigs.
func catchSignals(sigs []os.Signal) *frontSignals {
	s := &frontSignals{C: make(chan os.Signal, frontSignalQueue)}
	signal.Notify(s.C, sigs...)
	return s
}

// release stops catching: from then on the signals do what they do by
// default.
func (s *frontSignals) release() { signal.Stop(s.C) }

// commandSignaller is the sandbox's command as forward signals it.
type commandSignaller interface {
	Signal(os.Signal)
	Kill()
}

// forward passes sig on to the sandbox's command, and kills it at the
// second SIGTERM: asked twice, the command had its chance.
func (s *frontSignals) forward(sig os.Signal, to commandSignaller) {
	if sig == syscall.SIGTERM {
		s.terms++
		if s.terms > 1 {
			to.Kill()
			return
		}
	}
	to.Signal(sig)
}

// stopContext returns a context that the first signal read from C from
// now on cancels, after say was called with it (a front end that blocks
// in a call, as socks does in Serve, stops through it). Signals after the
// first are ignored. cancel ends the watch; call it before release.
func (s *frontSignals) stopContext(ctx context.Context, say func(os.Signal)) (_ context.Context, cancel context.CancelFunc) {
	sctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case sig := <-s.C:
			say(sig)
			cancel()
		case <-sctx.Done():
		}
	}()
	return sctx, cancel
}

// reloadOnHUP makes SIGHUP reload the policy of s, until ctx ends, instead
// of what it did (stop tunwall, or reach the command): the other signals
// reach C as before. Call it before C is read, and only for a session
// whose policy can be reloaded. A terminal that goes away still hangs up
// the command, which shares its session: the kernel signals it.
func (s *frontSignals) reloadOnHUP(ctx context.Context, sess *servedSession, stderr io.Writer) {
	in, out := s.C, make(chan os.Signal, frontSignalQueue)
	s.C = out
	go func() {
		for {
			select {
			case sig := <-in:
				if sig == syscall.SIGHUP {
					if _, err := sess.Reload(control.Requester{Via: "SIGHUP"}); err != nil {
						fmt.Fprintf(stderr, "tunwall: SIGHUP: the policy was not reloaded: %v; the policy in effect stays\n", err)
					}
					continue
				}
				select {
				case out <- sig:
				default: // as signal.Notify drops them
				}
			case <-ctx.Done():
				return
			}
		}
	}()
}
