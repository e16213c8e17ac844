// Package rt is the stack's runtime: what lets package stack's relays hold
// thousands of flows with no goroutine and no buffer per waiting flow, and
// what bounds what a burst of them can make tunwall hold. It knows nothing
// of flows, gVisor or the stack: its users implement its interfaces (a
// Target of the Poller, a Pump of the Runner, an Owner of the Budget).
//
// Each mechanism here stays only while it pays, in speed or in a bound
// that a test holds. The ledger (figures from the commits that brought
// them, on this project's 2-core VMs; "bound" rows are kept for what they
// bound, whatever their speed):
//
//	mechanism              what it buys                                   shown by
//	Poller (epoll set      a waiting flow holds no goroutine and no       TestEventRelayHoldsNoGoroutinePerWaitingFlow;
//	in Go's netpoller)     buffer: 8-10 KiB of tunwall per open            make bench BENCH=ConcurrentTCP (memory per
//	                       connection at 1,000-10,000 (bound); nested in   open connection); BenchmarkRelay (events
//	                       Go's poller, round trips at parity with the     vs goroutines, rr)
//	                       goroutine relay, where a thread blocked in
//	                       epoll_wait cost 2.5x their CPU (speed)
//	Runner                 a burst of ready flows runs on at most          TestPumpRunnerBoundsTheGoroutinesOfABurst,
//	                       max(64, 16 x GOMAXPROCS) goroutines: 16,000     TestPumpRunnerGivesEveryFlowATurn,
//	                       flows whose deadlines fired together took 43    TestPumpRunnerQueueDoesNotGrowWithTurns
//	                       MiB of stacks at once (bound)
//	Budget                 the gVisor buffers of all flows stay under      TestBudgetDividesItselfAmongBuffersAndCutsThemAsFlowsGrow,
//	                       Config.BufferBudget however many flows          TestLiveConnectionBuffersShrinkToTheBudget
//	                       (bound)
//	scratch classes        a move takes the smallest buffer that holds     TestScratchIsTheSmallestClassThatHoldsTheMove
//	(4, 16, 64 KiB)        the budget's share: with 16,000 flows,
//	                       hundreds of pumps held 64 KiB each to move
//	                       2 KiB, 20 MiB at once (bound)
//	MemWatch               new flows are refused near                      TestNewFlowsAreRefusedNearTheMemoryLimit
//	                       Config.MemoryLimit: the backstop of the
//	                       bounds above (bound)
//	WarmPool               flows and pumps start on goroutines whose       TUNWALL_BENCH_PATHS=tunwall
//	                       stacks have grown (runtime.newstack was 5.8%    TUNWALL_BENCH_MEASURE=cps make bench,
//	                       of the CPU): on a loaded VM (load 8-10), 4      alternated with and without;
//	                       pairs alternated, connections/s 906 vs 660      TestWarmPool*
//	                       (3 of 4 higher), 8 workers 1,675 vs 1,235
//	                       (4 of 4), CPU per 1,000 connections 0.88 vs
//	                       1.06 s (4 of 4 lower); on a quiet one within
//	                       noise (1,373 vs 1,372) (speed)
//
// And one of package stack's own, measured with these (2026-12-04, same
// A/B, loaded VM): a pump's first moves run inline on the poller's
// goroutine (pumpCore.kick, inlineMoves) instead of on a runner. With
// them, one worker's connections/s 1,012 vs 873 (3 of 4 pairs higher),
// connect+request p50 lower in 3 of 4; 8 workers 1,497 vs 2,032 (1 of 4
// higher). A trade, not noise: kept for the one-at-a-time path an agent's
// sequential requests take.
//
// The performance log (docs/design/performance-log.md) has the levers
// measured and not kept.
package rt
