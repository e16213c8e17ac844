// Package audit owns tunwall's audit log: a hash-chained JSONL file holding,
// per run, one header line, one line per decided flow, flow start or DNS
// query, and one trailer line. It writes the log (Writer), checks it
// (Verify, VerifyWith), reads it back (Records) and summarises it
// (Summarize, Tally).
//
// Every line carries `prev`, the hex SHA-256 of the previous line's bytes
// without their newline: of the previous line of the file, so a header's
// prev is the previous run's last line, and only the first line of a file
// has 64 zeros. The trailer repeats the last hash and counts the lines of
// its run, so a cut tail, a removed, inserted, reordered or edited line, and
// a whole run removed or moved, are found by Verify and named by line
// number. Open appends a new run to an existing file, chained to it.
//
// The chain has no key: it proves that a log is internally consistent and
// that nothing was cut, not who wrote it. Keep the Summary.Last of each run
// somewhere else, and give it to VerifyWith (VerifyOptions.Expect) to pin a
// log's contents up to that line.
//
// The Writer bounds what it writes: it folds repeated DNS queries and
// denials into one record per window (Record.Count), folds denials past a
// budget by registrable domain (Options.DenyRate, Record.Samples), holds
// lines to a rate and a run to a size (Options.MaxRate, MaxSize), and
// reports through Admit when new work must be denied. Allowed flows are never folded, and their
// start records go through Commit, which returns once the line is in the
// file.
//
// The package uses the standard library only. It does not log, does not
// decide anything about flows and does not know the policy format; callers
// fill Records with what they know. A Writer whose file cannot be written
// reports it through Err and Options.OnError, and callers must then deny new
// flows (fail closed).
package audit
