package inspect

import (
	"fmt"
	"strconv"

	"github.com/tunwall/tunwall/flow"
	"github.com/tunwall/tunwall/internal/sniff"
	"github.com/tunwall/tunwall/policy"
)

// State is where an Inspector is in the client's stream.
type State uint8

const (
	First   State = iota // classifying the first bytes
	Hello                // reading a TLS ClientHello
	Head                 // reading an HTTP request head
	Body                 // passing a request body
	Switch               // waiting for the server's answer to an Upgrade request
	Passing              // no more checks: bytes pass as they come
	Denied               // refused
)

// Where a name came from, as the audit record's host_from says it
// (audit.HostFromSNI, audit.HostFromHTTP).
const (
	FromSNI  = "sni"
	FromHTTP = "http"
)

// MaxRecorded bounds a sniffed value copied into a record or a reason.
const MaxRecorded = 255

// Config is what an Inspector checks against. Its zero value checks
// nothing by name: set Name, or Decide.
type Config struct {
	// Name is the flow's name: every TLS SNI and HTTP Host must be it (or
	// it written short, see Search). "" on a flow to a raw IP, until
	// Decide allows the first name read.
	Name string
	// Rule is the rule that allowed the flow; Decide replaces it.
	Rule string
	// Search is the host's resolver search list: a name may be sent short.
	Search []string
	// Decide judges the first name read on a raw-IP flow (Name is set
	// from it). from is FromSNI or FromHTTP. On a denial it returns the
	// verdict to refuse with and false; on an allow the verdict's Rule
	// becomes the flow's. nil for a flow to a name.
	Decide func(name, from string) (flow.Decision, bool)
	// Open is set on a raw-IP flow to the address Addr (its text,
	// netip.Addr.String) that the policy's open default allowed and that
	// was dialled: a name the client sends is judged by Decide, but a
	// client that sends none (another protocol, a ClientHello without
	// SNI, Addr as its HTTP Host) is judged by the address it was allowed
	// for.
	Open bool
	Addr string
	// Foreign finds, in a plain HTTP request head to Name, the
	// placeholder of a secret that name does not receive; nil when there
	// are no secrets.
	Foreign func(name string, head []byte) (flow.Decision, bool)
}

// Op is what the caller does next with the bytes it holds.
type Op uint8

const (
	// Wait: nothing can be done with the held bytes until more come.
	Wait Op = iota
	// Again: the state changed; call Next again with the same bytes.
	Again
	// Pass: send held[From:To] on, then drop held[:Drop].
	Pass
	// Refuse: reset the client. Verdict says why.
	Refuse
	// Forbid: answer the request that parsed with a 403. Verdict says why.
	Forbid
)

// Step is an Inspector's answer to the bytes it was shown.
type Step struct {
	Op             Op
	From, To, Drop int // Pass
	// Verdict is the denial of Refuse and Forbid: its Rule is "" for the
	// flow's rule, and its Reason says why.
	Verdict flow.Decision
	// Incomplete names the message held when Wait is for the rest of a
	// ClientHello or request head ("ClientHello", "request head").
	Incomplete string
	// Upgrade: the request head passed asks to switch protocols. The
	// caller watches the server's answer before it passes the head on,
	// and reports it with Switched.
	Upgrade bool
}

// An Inspector checks the bytes a client sends on one TCP flow: the names
// in its ClientHello and request heads, and what its requests ask of the
// connection. It does no I/O: the caller holds the bytes read but not yet
// passed on, shows them to Next, and does what the Step says. It is not
// safe for concurrent use.
type Inspector struct {
	name, rule string
	search     []string
	decide     func(name, from string) (flow.Decision, bool)
	foreign    func(name string, head []byte) (flow.Decision, bool)
	open       bool
	addr       string

	st       State
	kind     sniff.Kind
	ahead    int // bytes at the front of the held ones already passed on (a safe first-line prefix)
	req      sniff.Request
	body     sniff.Body
	requests int
	upgrade  bool // the request being passed asked to switch protocols
	judged   bool // the first ClientHello or request head passed

	sni, httpHost string // what was seen, for the flow's record
}

// New returns an Inspector for one flow.
func New(c Config) Inspector {
	return Inspector{name: c.Name, rule: c.Rule, search: c.Search, decide: c.Decide, foreign: c.Foreign, open: c.Open, addr: c.Addr}
}

// Next works on held, the bytes read and not yet dropped, and says what
// to do. canPass reports whether bytes may be passed on before a message
// is complete (there is an upstream to pass them to).
func (in *Inspector) Next(held []byte, canPass bool) Step {
	switch in.st {
	case First:
		return in.first(held, canPass)
	case Hello:
		return in.hello(held)
	case Head:
		return in.head(held)
	case Body:
		return in.bodyBytes(held)
	case Passing:
		return in.rest(held)
	}
	return Step{Op: Wait}
}

// first classifies the first bytes, whenever they come and whoever spoke
// first. Neither TLS nor HTTP: the flow is judged by its name alone.
func (in *Inspector) first(held []byte, canPass bool) Step {
	k, safe, ok := sniff.Classify(held)
	in.kind = k
	if !ok {
		if canPass && safe > in.ahead {
			s := Step{Op: Pass, From: in.ahead, To: safe}
			in.ahead = safe
			return s
		}
		return Step{Op: Wait}
	}
	switch k {
	case sniff.TLS:
		in.st = Hello
	case sniff.HTTP:
		in.st = Head
	default:
		if in.decide != nil && !in.open {
			return in.deny(Refuse, flow.Decision{Reason: "the client sent no name (TLS SNI or HTTP Host) to judge by"})
		}
		in.st, in.judged = Passing, true
	}
	return Step{Op: Again}
}

// hello reads a ClientHello: its SNI must be the flow's name; after it TLS
// is opaque and passes as is.
func (in *Inspector) hello(held []byte) Step {
	var h sniff.Hello
	switch h.Parse(held) {
	case sniff.NeedMore:
		return Step{Op: Wait, Incomplete: "ClientHello"}
	case sniff.NotThis:
		return in.deny(Refuse, flow.Decision{Reason: "TLS ClientHello refused: " + h.Bad})
	}
	if h.ServerName != nil {
		in.sni = Recorded(h.ServerName)
	}
	if s, ok := in.checkName(h.ServerName, FromSNI); !ok {
		return s
	}
	in.st, in.judged = Passing, true
	return Step{Op: Again}
}

// head reads a request head, strictly: its Host must be the flow's name,
// and what it asks of the connection must be something that can be
// followed.
func (in *Inspector) head(held []byte) Step {
	if len(held) == 0 {
		return Step{Op: Wait}
	}
	r := &in.req
	switch r.Parse(held) {
	case sniff.NeedMore:
		return Step{Op: Wait, Incomplete: "request head"}
	case sniff.NotThis:
		why := r.Bad
		if r.BadValue != nil {
			why += " (" + strconv.Quote(Recorded(r.BadValue)) + ")"
		}
		return in.deny(Refuse, flow.Decision{Reason: "HTTP request refused: " + why})
	}
	in.requests++
	if r.Host != nil {
		in.httpHost = Recorded(r.Host)
	}
	if s, ok := in.checkRequest(r); !ok {
		return s
	}
	if in.foreign != nil {
		if v, found := in.foreign(in.name, held[:r.HeadLen]); found {
			return in.deny(Forbid, v)
		}
	}
	s := Step{Op: Pass, From: min(in.ahead, r.HeadLen), To: r.HeadLen, Drop: r.HeadLen, Upgrade: in.upgrade}
	in.ahead, in.judged = 0, true
	in.body.Start(r)
	switch {
	case !in.body.Done():
		in.st = Body
	case in.upgrade:
		in.st = Switch
	}
	return s
}

// bodyBytes follows a request body (length, chunked) to find the next
// head.
func (in *Inspector) bodyBytes(held []byte) Step {
	if len(held) == 0 {
		return Step{Op: Wait}
	}
	n, st := in.body.Feed(held)
	if st == sniff.NotThis {
		return in.deny(Refuse, flow.Decision{Reason: "HTTP request body refused: " + in.body.Bad})
	}
	if st == sniff.Done {
		if in.upgrade {
			in.st = Switch
		} else {
			in.st = Head
		}
	}
	return Step{Op: Pass, To: n, Drop: n}
}

// rest passes on what is held once the checks are over.
func (in *Inspector) rest(held []byte) Step {
	s := Step{Op: Pass, From: min(in.ahead, len(held)), To: len(held), Drop: len(held)}
	in.ahead = 0
	return s
}

// Switched reports the server's answer to the Upgrade request: after a
// 101 (ok) the bytes pass as they are, otherwise HTTP goes on being
// checked.
func (in *Inspector) Switched(ok bool) {
	in.upgrade = false
	if ok {
		in.st = Passing
	} else {
		in.st = Head
	}
}

// PassAll ends the checks of a judged flow: its bytes pass as they come
// (the terminator checks every request itself).
func (in *Inspector) PassAll() {
	if in.st != Denied {
		in.st = Passing
	}
}

// Deny ends the checks: the flow is refused.
func (in *Inspector) Deny() { in.st = Denied }

// DropForeign stops looking for foreign placeholders (the terminator
// knows which secrets the host receives).
func (in *Inspector) DropForeign() { in.foreign = nil }

// Holding reports whether the caller, holding n bytes, is waiting for a
// message to complete (and the time it may take counts).
func (in *Inspector) Holding(n int) bool {
	switch in.st {
	case First, Hello, Head:
		return n > in.ahead || (in.decide != nil && !in.open && !in.judged)
	}
	return false
}

// Waiting names the message a holding caller waits for.
func (in *Inspector) Waiting() string {
	switch in.st {
	case Hello:
		return "ClientHello"
	case Head:
		return "request head"
	}
	return "first message"
}

// State returns where the inspector is.
func (in *Inspector) State() State { return in.st }

// Kind returns what the first bytes were classified as.
func (in *Inspector) Kind() sniff.Kind { return in.kind }

// Name returns the flow's name (on a raw-IP flow, the one Decide allowed).
func (in *Inspector) Name() string { return in.name }

// Rule returns the rule that allowed the flow.
func (in *Inspector) Rule() string { return in.rule }

// SNI and HTTPHost return the last TLS SNI and HTTP Host seen (at most
// MaxRecorded bytes), for the flow's record.
func (in *Inspector) SNI() string      { return in.sni }
func (in *Inspector) HTTPHost() string { return in.httpHost }

// Requests returns how many request heads passed the parser.
func (in *Inspector) Requests() int { return in.requests }

// Judged reports whether the first ClientHello or request head passed.
func (in *Inspector) Judged() bool { return in.judged }

// Upgrading reports whether the request being passed asked to switch
// protocols.
func (in *Inspector) Upgrading() bool { return in.upgrade }

func (in *Inspector) deny(op Op, v flow.Decision) Step {
	in.st = Denied
	return Step{Op: op, Verdict: v}
}

// checkName checks a name the client sent (raw, as sent; nil if none)
// against the flow's name, or, on a raw-IP flow, has Decide judge it. A
// refused TLS name resets; a refused HTTP name gets a 403.
func (in *Inspector) checkName(raw []byte, from string) (Step, bool) {
	what, op := "TLS SNI", Refuse
	if from == FromHTTP {
		what, op = "HTTP Host", Forbid
	}
	if raw == nil || in.open && in.name == "" && in.addr != "" && sniff.EqualFold(raw, in.addr) {
		if in.decide != nil && in.name == "" && !in.open {
			return in.deny(op, flow.Decision{Reason: "the client sent no name (TLS SNI or HTTP Host) to judge by"}), false
		}
		return Step{}, true // judged by the name the client connected to
	}
	var name string
	if flow.ValidHostname(raw) {
		name, _ = policy.NormalizeHost(string(raw))
	}
	if name == "" {
		return in.deny(op, flow.Decision{Reason: fmt.Sprintf("%s %q is not a hostname", what, Recorded(raw))}), false
	}
	if in.name == "" && in.decide != nil {
		v, ok := in.decide(name, from)
		if !ok {
			return in.deny(op, v), false
		}
		in.name, in.rule = name, v.Rule
		return Step{}, true
	}
	if name != in.name && !searchExpands(in.search, name, in.name) {
		return in.deny(op, flow.Decision{Reason: fmt.Sprintf("%s name %s disagrees with %s, the name this connection is for (domain fronting)", from, name, in.name)}), false
	}
	return Step{}, true
}

// checkRequest checks one parsed request head: its name, and what it asks
// the server to do with the connection.
func (in *Inspector) checkRequest(r *sniff.Request) (Step, bool) {
	if s, ok := in.checkName(r.Host, FromHTTP); !ok {
		return s, false
	}
	if sniff.EqualFold(r.Method, "connect") {
		return in.deny(Forbid, flow.Decision{Reason: "CONNECT is not relayed: what goes through the tunnel could not be checked"}), false
	}
	if r.Upgrade == nil {
		return Step{}, true
	}
	for _, tok := range sniff.UpgradeTokens(r.Upgrade) {
		switch {
		case sniff.EqualFold(tok, "h2c"):
			return in.deny(Forbid, flow.Decision{Reason: "Upgrade: h2c is not relayed: HTTP/2 requests could not be checked"}), false
		case !sniff.EqualFold(tok, "websocket"):
			return in.deny(Forbid, flow.Decision{Reason: fmt.Sprintf("Upgrade: %q is not relayed: only websocket is", Recorded(tok))}), false
		}
	}
	if in.requests > 1 {
		return in.deny(Forbid, flow.Decision{Reason: "an Upgrade request must be the first on its connection (tunwall watches the first response for the switch)"}), false
	}
	in.upgrade = true
	return Step{}, true
}

// Recorded returns b as a string for a record, at most MaxRecorded bytes.
func Recorded(b []byte) string {
	if len(b) > MaxRecorded {
		b = b[:MaxRecorded]
	}
	return string(b)
}
