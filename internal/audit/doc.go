// Package audit owns tunwall's audit log: a hash-chained JSONL file holding one
// header line, one line per decided flow or DNS query, and one trailer line per
// run. It writes the log (Writer), checks it (Verify), reads it back (Records)
// and summarises it (Summarize, Tally).
//
// Every line carries `prev`, the hex SHA-256 of the previous line's bytes
// without their newline; a header's prev is 64 zeros. The trailer repeats the
// last hash and counts the lines before it, so a cut tail, a removed, inserted,
// reordered or edited line is found by Verify and named by line number. A file
// may hold several runs one after another (each header … trailer); Open
// appends a new run to an existing file.
//
// The chain has no key: it proves that a log is internally consistent and
// that nothing was cut, not who wrote it. Keep the Summary.Last of each run
// somewhere else to pin a log's contents.
//
// The package uses the standard library only. It does not log, does not
// decide anything about flows and does not know the policy format; callers
// fill Records with what they know. A Writer whose file cannot be written
// reports it through Err and Options.OnError, and callers must then deny new
// flows (fail closed).
package audit
