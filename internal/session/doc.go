// Package session assembles one served sandbox: the rule set it is given,
// the fake-address pool and the resolver for allowed names, the audit log,
// process attribution, the terminator, the engine and, once a TUN is handed
// over, the stack. It is what `tunwall run`, `bwrap`, `attach` and `socks`
// drive, and what a node agent serving many sandboxes in one process will
// drive: New builds everything but the stack, Start serves a TUN, Close
// undoes both in one fixed order and says whether the audit log is whole.
//
// It parses no flags and reads no policy file: cmd/tunwall does both and
// fills Options. What a front end needs built below the session comes
// from here too, so that cmd/tunwall assembles nothing itself: the run's
// Credentials (secrets and CA, made before the sandbox exists),
// ServeSOCKS and LocalNamespace for a SOCKS5 front end, DefaultPlan. It holds no process-wide state either (signals, the Go
// runtime's memory limit): those are the caller's.
package session
