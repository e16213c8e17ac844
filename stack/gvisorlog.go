package stack

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	glog "gvisor.dev/gvisor/pkg/log"
)

// gVisor's pkg/log is process-global and writes to stderr from its init.
// Left there, a line gVisor logs about a packet would reach the user's
// terminal, shaped in part by what the sandbox sent. It goes to tunwall's
// logger instead, at debug level only: gVisor's warnings are about its own
// internals, never a decision of ours.
var (
	gvisorLogOnce sync.Once
	gvisorLogger  atomic.Pointer[slog.Logger] // the most recent Stack's; nil discards
)

// routeGVisorLog sends gVisor's log to l (nil: nowhere) from now on. The
// target is set once per process; with several Stacks, the most recently
// created one's logger receives it.
func routeGVisorLog(l *slog.Logger) {
	gvisorLogOnce.Do(func() { glog.SetTarget(gvisorEmitter{}) })
	gvisorLogger.Store(l)
}

// gvisorEmitter is a glog.Emitter writing through slog at debug level. slog's
// handlers quote a message holding newlines or control characters, so it
// cannot forge lines either.
type gvisorEmitter struct{}

func (gvisorEmitter) Emit(_ int, level glog.Level, _ time.Time, format string, args ...any) {
	l := gvisorLogger.Load()
	if l == nil || !l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	l.Debug("gvisor: "+fmt.Sprintf(format, args...), "gvisor_level", level.String())
}
