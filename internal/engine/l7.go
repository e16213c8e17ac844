package engine

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/inspect"
	"github.com/tunwall/tunwall/internal/l7"
	"github.com/tunwall/tunwall/internal/secrets"
	"github.com/tunwall/tunwall/internal/sniff"
	"github.com/tunwall/tunwall/stack"
)

// Credentials and the terminator (README: "Keeping credentials out of the
// sandbox"). A TCP flow to a name whose rules have http or inject is
// decided, dialled and accepted as any other; then, instead of the plain
// relay, the inspectConn reads and checks its first ClientHello or request
// head, and hands the connection (and the upstream connection dialled for
// it) to the terminator, which terminates it and checks every request. Every
// other flow is relayed as before, never decrypted. Placeholders of
// secrets are refused wherever they would leave for a host that does not
// receive the secret: a DNS name, a sniffed name, a plain HTTP head.

// ruleCredentialPlaceholder is the rule of a denial for a placeholder on
// its way to a host that does not receive its secret.
const ruleCredentialPlaceholder = "credential-placeholder"

// terminates reports whether fr's flow goes to the terminator.
func (e *Engine) terminates(fr *flowRecord) bool {
	return e.cfg.L7 != nil && fr.Host != "" && fr.f.Proto == stack.TCP &&
		e.rules().HTTPFor(fr.Host, fr.f.Dst.Port()).Terminate
}

// terminate serves a flow through the terminator and records it. c is the
// sandbox's connection (or the inspectConn that already read its first
// message, on a raw-IP flow), up the upstream connection dialled for it.
func (e *Engine) terminate(ctx context.Context, fr *flowRecord, c, up net.Conn) {
	ic, _ := c.(*inspectConn)
	if ic == nil {
		ic = e.inspectReq(fr, c, fr.Host, fr.v.Rule, 0, nil)
	}
	ic.in.DropForeign() // the terminator knows which secrets this host receives
	if !ic.in.Judged() {
		// The first byte may come whenever it likes, but not never: the
		// flow's idle bound applies until it does.
		ic.Conn.SetReadDeadline(time.Now().Add(e.cfg.TCPIdle))
		err := ic.judge()
		ic.Conn.SetReadDeadline(time.Time{})
		ic.dlAt = time.Time{}
		if err != nil {
			up.Close()
			if denied, _ := ic.result(); denied == nil {
				ic.Close()
			}
			e.inspected(fr, ic)
			return
		}
	}
	if k := ic.in.Kind(); k != sniff.TLS && k != sniff.HTTP {
		up.Close()
		ic.reset()
		ic.setDenied(verdict{Reason: "the client sent neither TLS nor HTTP, the only protocols of a host with http or inject rules"})
		e.inspected(fr, ic)
		return
	}
	ic.passAll()
	port := fr.f.Dst.Port()
	upAt := fr.dialAt
	if upAt.IsZero() {
		upAt = time.Now()
	}
	res := e.cfg.L7.Serve(ctx, l7.Flow{
		Host:   fr.Host,
		Port:   port,
		TLS:    ic.in.Kind() == sniff.TLS,
		Client: ic,
		Up:     up,
		UpAt:   upAt,
		Dial: func(ctx context.Context) (net.Conn, error) {
			scratch := &flowRecord{f: fr.f}
			return e.dialName(ctx, scratch, fr.Host, port)
		},
		Rec:          &httpRecorder{e: e, fr: fr},
		SandboxReset: stack.SandboxReset,
		Abort:        stack.AbortConn,
	})
	fr.BytesOut += res.In
	fr.BytesIn += res.Out
	fr.v.Reason += fmt.Sprintf("; terminated by tunwall: %d HTTP requests", res.Requests)
	if res.Note != "" {
		fr.v.Reason += "; " + res.Note
	}
	if res.CertRefused {
		fr.certRejected = true
		e.denials.printf("tunwall: cert-rejected %s %s: %s", target(fr.Host, fr.f.Dst.Addr(), port), fr.f.Proto, res.Note)
	}
	e.inspected(fr, ic)
}

// httpRecorder turns the terminator's requests into http records of the
// flow.
type httpRecorder struct {
	e  *Engine
	fr *flowRecord
}

func (h *httpRecorder) Admit() error {
	if h.e.cfg.Audit == nil {
		return nil
	}
	return h.e.cfg.Audit.Admit()
}

func (h *httpRecorder) Request(r l7.Record) {
	e, fr := h.e, h.fr
	if !r.Allowed && r.Reason != "" {
		e.denials.printf("tunwall: denied %s %s: %s", r.Method, r.URL, r.Reason)
	}
	if r.Allowed && r.UpstreamFailed {
		// No silent failure: an allowed request tunwall answered 502.
		e.denials.printf("tunwall: failed %s %s: %s", r.Method, r.URL, r.Reason)
	}
	if e.cfg.Audit == nil {
		return
	}
	rec := fr.record(audit.KindHTTP)
	rec.TS = r.Start
	rec.Method, rec.Path, rec.Status = r.Method, r.Path, r.Status
	rec.BytesOut, rec.BytesIn = r.BytesOut, r.BytesIn
	rec.DurationMS = float64(r.Duration.Microseconds()) / 1000
	rec.Verdict, rec.Rule, rec.Reason = audit.VerdictDeny, r.Rule, r.Reason
	if r.Allowed {
		rec.Verdict = audit.VerdictAllow
	}
	if rec.Rule == "" {
		rec.Rule = "default-deny"
	}
	rec.Secrets = strings.Join(r.Injected, ",")
	setOwner(&rec, fr.owner.wait())
	e.cfg.Audit.Write(rec)
}

// placeholderIn refuses a name that carries a secret's placeholder: no
// host receives a secret through a name (DNS, SNI, Host, SOCKS).
func (e *Engine) placeholderIn(name, where string) (verdict, bool) {
	if e.cfg.Secrets.Len() == 0 {
		return verdict{}, false
	}
	if stale, ok := e.cfg.Secrets.StaleString(name); ok {
		return verdict{Rule: ruleCredentialPlaceholder, Reason: fmt.Sprintf("credential placeholder of %s from an earlier run in %s %s", stale, where, inspect.Recorded([]byte(name)))}, true
	}
	found := e.cfg.Secrets.ScanString(name)
	if len(found) == 0 {
		return verdict{}, false
	}
	return verdict{Rule: ruleCredentialPlaceholder, Reason: fmt.Sprintf("credential placeholder %s in %s %s", found[0].Name, where, inspect.Recorded([]byte(name)))}, true
}

// foreignInHead finds, in a plain HTTP request head to name, the
// placeholder of a secret name's rules do not inject.
func (e *Engine) foreignInHead(name string, port uint16, head []byte) (verdict, bool) {
	if stale, ok := e.cfg.Secrets.Stale(head); ok {
		return verdict{Rule: ruleCredentialPlaceholder, Reason: fmt.Sprintf("credential placeholder of %s from an earlier run, sent to %s", stale, name)}, true
	}
	found := e.cfg.Secrets.Scan(head)
	if len(found) == 0 {
		return verdict{}, false
	}
	view := e.rules().HTTPFor(name, port)
	for _, s := range found {
		if !view.Injects(s.Name) {
			return verdict{Rule: ruleCredentialPlaceholder, Reason: placeholderReason(s, name, e.rules().InjectHosts(s.Name))}, true
		}
	}
	return verdict{}, false
}

func placeholderReason(s *secrets.Secret, host string, injected []string) string {
	r := fmt.Sprintf("credential placeholder %s sent to %s", s.Name, host)
	if len(injected) > 0 {
		r += " (" + s.Name + " is injected only for " + strings.Join(injected, ", ") + ")"
	}
	return r
}
