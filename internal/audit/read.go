package audit

import (
	"io"
	"iter"
)

// Records reads the records of a log (flow, start, dns and limit lines),
// in file order, skipping header and trailer lines. A folded record (Count
// set) stands for several; callers that count should weigh it. It does not check the hash chain (see Verify).
// A line that cannot be parsed yields a zero Record and a *VerifyError naming
// it, and reading goes on; an I/O error is yielded last. Stop early by
// breaking out of the loop.
func Records(r io.Reader) iter.Seq2[Record, error] {
	return RecordsWithHeaders(r, nil)
}

// RecordsWithHeaders is Records, also calling header (when not nil) with
// each run's header line as it is read, before the run's records: what a
// reader of the records needs of the run (its config: secrets' names and
// sources, its policy) comes from there.
func RecordsWithHeaders(r io.Reader, header func(Header)) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		n := 0
		err := scan(r, func(_ []byte, _ bool, l *anyLine, perr error) bool {
			n++
			switch {
			case perr != nil:
				return yield(Record{}, &VerifyError{Line: n, Msg: perr.Error()})
			case l.Kind == KindHeader:
				if header != nil {
					header(Header{Run: l.Run, Phase: l.Phase, Version: l.Version, Policy: l.Policy,
						PolicySHA256: l.PolicySHA256, Argv: l.Argv, Config: l.Config, Labels: Labels(l.Labels), Stream: l.Stream, Seq: l.Seq})
				}
				return true
			case l.Kind == KindTrailer:
				return true
			default:
				return yield(l.record(), nil)
			}
		})
		if err != nil {
			yield(Record{}, err)
		}
	}
}
