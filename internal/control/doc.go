// Package control owns the control socket of one served sandbox: where it
// lives (Dir, SocketPath), who may use it (the peer checks: never a process
// of the sandbox, never another user), the ctl protocol (one JSON request
// a connection, one JSON answer), its client (Dial, List), the counters a
// session feeds it from its audit records (Counts) and the metrics text
// made from them with the Prometheus client library.
//
// It decides no flow: what it reports it asks the session for (Source).
// It never blocks the data path: the counters are updated under a short
// lock, and the socket's clients are bounded in number, request size and
// time.
package control
