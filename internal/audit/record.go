package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"
)

// Values of Record.Kind and of the kind field of header and trailer lines.
const (
	KindFlow  = "flow"  // a flow, written when it ends (a denied flow: when it is denied)
	KindDNS   = "dns"   // a DNS query, written when it is answered
	KindStart = "start" // an allowed flow opening, written before it carries a byte
	KindHTTP  = "http"  // one request on a flow tunwall terminated, written when it is answered
	KindPhase = "phase" // the policy in effect changed (a phase switch or a reload), and who asked
	// KindApproval: a request --ask held (outcome OutcomePending), or its
	// answer (OutcomeApproved, OutcomeDenied, OutcomeTimeout), or one
	// denied at once past the bounds of the pending set (OutcomeDenied).
	KindApproval = "approval"
	KindLimit    = "limit"   // a bound of the log was reached (written by the Writer itself)
	KindHeader   = "header"  // the first line of a run
	KindTrailer  = "trailer" // the last line of a run
)

// Values of Record.Outcome: how an allowed flow went.
const (
	OutcomeOK                  = "ok"                    // the upstream was reached and the flow relayed
	OutcomeRefused             = "refused"               // the upstream refused the connection
	OutcomeTimeout             = "timeout"               // the dial (or the name's resolution) timed out
	OutcomeUnreachable         = "unreachable"           // no route, host unreachable, or another dial error
	OutcomeUpstreamProxyFailed = "upstream-proxy-failed" // the --upstream SOCKS5 proxy failed or refused
	OutcomeDNSFailed           = "dns-failed"            // the name did not resolve to an address
	OutcomeCertRejected        = "cert-rejected"         // the client refused the run's certificate of a terminated host
	OutcomeReset               = "reset"                 // relayed, then one end reset the connection (the other end was reset too)
	OutcomeRevoked             = "revoked"               // cut (reset both ways) when the policy changed to one that denies it
	// Outcomes of approval records.
	OutcomePending  = "pending"  // held, waiting for a decision
	OutcomeApproved = "approved" // allowed by a decision (the rule names its scope)
	OutcomeDenied   = "denied"   // denied by a decision, a dead decider or a bound
)

// Rules of the records the Writer writes itself, and of the denials a
// caller records because a bound was reached.
const (
	RuleMaxSize  = "audit-max-size" // the run's log reached Options.MaxSize
	RuleMaxRate  = "audit-max-rate" // lines arrived faster than Options.MaxRate
	RuleOverflow = "audit-overflow" // repeatable records counted, not written one by one
)

// Values of Record.Verdict.
const (
	VerdictAllow = "allow"
	VerdictDeny  = "deny"
)

// Values of Record.Proto.
const (
	ProtoTCP = "tcp"
	ProtoUDP = "udp"
)

// Values of Record.HostFrom: where the flow's hostname came from.
const (
	HostFromDNS  = "dns"  // the fake IP the client connected to, from our own DNS answer
	HostFromSNI  = "sni"  // the TLS ClientHello's server name
	HostFromHTTP = "http" // the HTTP Host header
	HostFromNone = "none" // no name known (a raw-IP flow)
	// HostFromSOCKS: the name a SOCKS5 client asked for (tunwall socks).
	HostFromSOCKS = "socks"
)

// tsLayout is RFC 3339 with a fixed nine-digit fraction, so that timestamps
// sort as text and every line of a run has the same shape.
const tsLayout = "2006-01-02T15:04:05.000000000Z07:00"

// zeroHash is the prev of every header line.
var zeroHash [sha256.Size]byte

// Record is one flow, start, DNS or limit line of the audit log. Callers
// fill what they know; Writer.Write sets TS when it is zero, Run always (the
// header's run) and Phase when it is empty (the header's phase). Prev is set
// by the writer and ignored in a Record passed to Write; Records fills it
// when reading. The JSON keys and their order are the log format; every key
// is written, except that DialFailed, SNI, HTTPHost, Qname, Qtype, Rcode,
// Outcome, Count, Samples and Until are omitted when empty.
//
// A record with a Count stands for Count occurrences, from TS to Until, of
// records identical in every field the Writer folds on (see Options.FoldWindow),
// or, with Samples, of denials under one registrable domain with the same
// rule and reason (see Options.DenyRate); its Src, PID and other
// per-occurrence fields are those of the first of them.
type Record struct {
	TS       time.Time      `json:"ts"`        // when the flow was decided or the query answered; written in UTC
	Run      string         `json:"run"`       // run id, as in the header
	Phase    string         `json:"phase"`     // policy phase in effect, e.g. "setup" or "exec"
	Kind     string         `json:"kind"`      // KindFlow or KindDNS
	Proto    string         `json:"proto"`     // ProtoTCP or ProtoUDP
	Src      netip.AddrPort `json:"src"`       // sandbox-side source; zero is written as ""
	Dst      netip.AddrPort `json:"dst"`       // ip:port the sandbox asked for (a fake IP when from our DNS)
	Host     string         `json:"host"`      // hostname the verdict was about, "" if none
	HostFrom string         `json:"host_from"` // HostFromDNS, HostFromSNI, HostFromHTTP, HostFromSOCKS or HostFromNone
	Port     uint16         `json:"port"`      // destination port the verdict was about
	Verdict  string         `json:"verdict"`   // VerdictAllow or VerdictDeny
	Rule     string         `json:"rule"`      // the rule that matched, or "default-deny"
	Reason   string         `json:"reason"`    // why, in words
	PID      int            `json:"pid"`       // process owning the socket, 0 if unknown
	Comm     string         `json:"comm"`      // its /proc/PID/comm
	Exe      string         `json:"exe"`       // its /proc/PID/exe target
	// Owner is "" when PID/Comm/Exe are exact, else a note such as "gone",
	// "ambiguous: pids 12,14" or "unknown".
	Owner      string         `json:"owner"`
	BytesOut   int64          `json:"bytes_out"`   // sandbox → world
	BytesIn    int64          `json:"bytes_in"`    // world → sandbox
	DurationMS float64        `json:"duration_ms"` // flow lifetime; a NaN or infinity is written as -1
	Dial       netip.AddrPort `json:"dial"`        // the real ip:port dialled; zero ("") if none
	// DialFailed lists the addresses of the name that were tried and did
	// not connect (Happy Eyeballs), each as "ip:port: why", in the order
	// they were tried, separated by "; "; omitted when none failed.
	DialFailed string `json:"dial_failed,omitempty"`
	SNI        string `json:"sni,omitempty"`       // the TLS SNI the client sent, as sent (flows only)
	HTTPHost   string `json:"http_host,omitempty"` // the HTTP Host the client sent, without port (flows only)
	Qname      string `json:"qname,omitempty"`
	Qtype      string `json:"qtype,omitempty"` // e.g. "A", "AAAA", "TXT"
	Rcode      string `json:"rcode,omitempty"` // e.g. "NOERROR", "NXDOMAIN", "REFUSED"
	// Outcome is set on the flow record of an allowed flow: OutcomeOK,
	// ...; and to OutcomeDNSFailed on the dns record of an allowed query
	// tunwall forwarded that the upstream did not answer (timeout,
	// SERVFAIL, REFUSED).
	Outcome string `json:"outcome,omitempty"`
	// Method, Path and Status describe the request of an http record: the
	// path is escaped and never holds the query string.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	// Secrets names the secrets injected into an http record's request,
	// comma-separated; never their values.
	Secrets string `json:"secrets,omitempty"`
	// Count, when not 0, is how many occurrences a folded record stands
	// for; 0 means this one alone.
	Count int `json:"count,omitempty"`
	// Samples is set on a record that folds denials of several names by
	// their registrable domain (Options.DenyRate): up to MaxSamples of the
	// names, each cut to MaxSampleLen bytes, the unused ones empty (an
	// array, so that Records stay comparable). Host is then the domain, and
	// Qname, SNI, HTTPHost and Path are empty. It is written as a JSON
	// array of the names, omitted when there are none.
	Samples [MaxSamples]string `json:"samples"`
	// Until is the time of the last occurrence a folded record stands for.
	Until time.Time `json:"until,omitzero"`
	// Labels are the run's labels (see Labels), written as a JSON object,
	// omitted when there are none.
	Labels Labels `json:"labels,omitempty"`
	Prev   string `json:"prev"` // hex SHA-256 of the previous line
}

// recordFields is Record's one list of fields, without its methods. The
// wire forms of a line embed it (encoding/json writes an embedded struct's
// fields in place, in their order) and declare only the fields whose wire
// form differs: a field of the outer struct hides the embedded one of the
// same key, and takes its place in the order only if it comes where the
// embedded one would (ts first; until and prev last).
type recordFields Record

// flowLine is the wire form of a flow, start, DNS, limit or http line:
// Record, with ts and until preformatted. Its encoding/json bytes are the
// format; appendLine writes the same bytes without reflection.
type flowLine struct {
	TS string `json:"ts"`
	recordFields
	Samples []string        `json:"samples,omitempty"` // the non-empty Samples
	Until   string          `json:"until,omitempty"`
	Labels  json.RawMessage `json:"labels,omitempty"`
	Prev    string          `json:"prev"`
}

// headerLine is the first line of a run. Its prev is the hash of the line
// before it in the file (the previous run's last line), or 64 zeros when it
// is the first line.
type headerLine struct {
	TS           string            `json:"ts"`
	Run          string            `json:"run"`
	Phase        string            `json:"phase"`
	Kind         string            `json:"kind"`
	Version      string            `json:"version"`
	Policy       string            `json:"policy"`
	PolicySHA256 string            `json:"policy_sha256"`
	Argv         []string          `json:"argv"`
	Config       map[string]string `json:"config"`
	Labels       json.RawMessage   `json:"labels,omitempty"`
	// Stream and Seq name the shared output a run was written to (Stream)
	// and its place among that output's runs (1 for the first): set on a
	// Stream only, absent in a file.
	Stream string `json:"stream,omitempty"`
	Seq    int    `json:"seq,omitempty"`
	Prev   string `json:"prev"`
}

// trailerLine is the last line of a run.
type trailerLine struct {
	TS     string          `json:"ts"`
	Run    string          `json:"run"`
	Phase  string          `json:"phase"`
	Kind   string          `json:"kind"`
	Count  int             `json:"count"` // lines of the run before the trailer, header included
	Last   string          `json:"last"`  // same as Prev
	Lost   int             `json:"lost"`
	Labels json.RawMessage `json:"labels,omitempty"`
	Prev   string          `json:"prev"`
}

// anyLine is what a line of any kind decodes into: a Record's fields (with
// ts, until and count as written), and those of headers and trailers.
type anyLine struct {
	TS string `json:"ts"`
	recordFields
	Until string `json:"until"`

	Version      string            `json:"version"`
	Policy       string            `json:"policy"`
	PolicySHA256 string            `json:"policy_sha256"`
	Argv         []string          `json:"argv"`
	Config       map[string]string `json:"config"`
	Stream       string            `json:"stream"`
	Seq          int               `json:"seq"`

	Count *int   `json:"count"` // a trailer's lines, a folded record's occurrences
	Last  string `json:"last"`
	Lost  int    `json:"lost"`

	Labels json.RawMessage `json:"labels"`
	Prev   string          `json:"prev"`

	ts    time.Time         // parsed TS
	until time.Time         // parsed Until
	prev  [sha256.Size]byte // decoded Prev
}

// decodeLine parses one line (without its newline) and checks the fields
// every kind shares: a valid ts and a 64-hex-digit prev.
func decodeLine(b []byte, l *anyLine) error {
	*l = anyLine{}
	if len(bytes.TrimSpace(b)) == 0 {
		return fmt.Errorf("empty line")
	}
	if err := json.Unmarshal(b, l); err != nil {
		return fmt.Errorf("not a valid JSON record: %w", err)
	}
	ts, err := time.Parse(time.RFC3339Nano, l.TS)
	if err != nil {
		return fmt.Errorf("bad ts %q: %w", l.TS, err)
	}
	l.ts = ts
	if len(l.Prev) != hex.EncodedLen(sha256.Size) {
		return fmt.Errorf("prev %q is not 64 hex digits", l.Prev)
	}
	if _, err := hex.Decode(l.prev[:], []byte(l.Prev)); err != nil {
		return fmt.Errorf("prev %q is not 64 hex digits: %w", l.Prev, err)
	}
	switch l.Kind {
	case KindFlow, KindDNS, KindStart, KindLimit, KindHTTP, KindPhase, KindApproval:
		if l.Count != nil && *l.Count < 1 {
			return fmt.Errorf("count %d is not a positive number of occurrences", *l.Count)
		}
		if l.Until != "" {
			if l.until, err = time.Parse(time.RFC3339Nano, l.Until); err != nil {
				return fmt.Errorf("bad until %q: %w", l.Until, err)
			}
		}
	case KindHeader:
	case KindTrailer:
		if l.Count == nil {
			return fmt.Errorf("trailer has no count")
		}
	default:
		return fmt.Errorf("unknown kind %q", l.Kind)
	}
	return nil
}

// record converts a decoded flow, start, DNS or limit line to a Record.
func (l *anyLine) record() Record {
	r := Record(l.recordFields)
	r.TS, r.Until, r.Prev = l.ts, l.until, l.Prev
	r.Labels = Labels(l.Labels)
	r.Count = 0
	if l.Count != nil {
		r.Count = *l.Count
	}
	return r
}

// chain appends hash-chained lines to a buffer. It is the only code that
// produces log lines; Writer and the tests' fixed logs both use it.
type chain struct {
	buf   bytes.Buffer
	enc   *json.Encoder
	last  [sha256.Size]byte // hash of the last line appended
	lines int               // lines appended since the header, header included
	bytes int64             // bytes appended since the header, header and newlines included
}

func newChain() *chain {
	c := &chain{}
	c.enc = json.NewEncoder(&c.buf)
	c.enc.SetEscapeHTML(false)
	return c
}

// add encodes v (whose prev the caller set from c.last) as one line and
// returns the new line's hash.
func (c *chain) add(v any) ([sha256.Size]byte, error) {
	start := c.buf.Len()
	if err := c.enc.Encode(v); err != nil {
		c.buf.Truncate(start)
		return [sha256.Size]byte{}, fmt.Errorf("audit: encode: %w", err)
	}
	return c.appended(start), nil // Encode ends each value with '\n'
}

// appended chains the line appended to c.buf from start, newline included,
// and returns its hash.
func (c *chain) appended(start int) [sha256.Size]byte {
	b := c.buf.Bytes()
	h := sha256.Sum256(b[start : len(b)-1])
	c.last = h
	c.lines++
	c.bytes += int64(len(b) - start)
	return h
}

// header starts a run; prev is the hash of the line before it in the file,
// zeroHash for the first line of a file.
func (c *chain) header(ts time.Time, h Header, prev [sha256.Size]byte) ([sha256.Size]byte, error) {
	c.last, c.lines = prev, 0
	argv := h.Argv
	if argv == nil {
		argv = []string{}
	}
	cfg := h.Config
	if cfg == nil {
		cfg = map[string]string{}
	}
	return c.add(&headerLine{
		TS: ts.UTC().Format(tsLayout), Run: h.Run, Phase: h.Phase, Kind: KindHeader,
		Version: h.Version, Policy: h.Policy, PolicySHA256: h.PolicySHA256,
		Argv: argv, Config: cfg, Labels: json.RawMessage(h.Labels), Stream: h.Stream, Seq: h.Seq, Prev: hex.EncodeToString(prev[:]),
	})
}

// record appends r's line: flowLine's encoding, written by appendLine.
func (c *chain) record(r *Record) ([sha256.Size]byte, error) {
	start := c.buf.Len()
	c.buf.Write(appendLine(c.buf.AvailableBuffer(), r, &c.last))
	return c.appended(start), nil
}

func (c *chain) trailer(ts time.Time, run, phase string, lost int, labels Labels) ([sha256.Size]byte, error) {
	last := hex.EncodeToString(c.last[:])
	return c.add(&trailerLine{
		TS: ts.UTC().Format(tsLayout), Run: run, Phase: phase, Kind: KindTrailer,
		Count: c.lines, Last: last, Lost: lost, Labels: json.RawMessage(labels), Prev: last,
	})
}
