package l7

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestRequestsTheHTTP2ServerAnswersItselfAreRecorded: x/net's HTTP/2
// server answers a request with a connection-specific header (400) or a
// header list over the limit (431) with handlers of its own, which never
// reach the flow's handler; each connection's such requests must still
// leave a record, beside the records of the requests it did hand on.
func TestRequestsTheHTTP2ServerAnswersItselfAreRecorded(t *testing.T) {
	fx := newFixture(t, true, true)
	a, b := net.Pipe()
	up, err := net.Dial("tcp", fx.up.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		fx.results <- fx.tm.Serve(context.Background(), Flow{Host: "api.test", Port: 443, TLS: true, Client: b, Up: up, UpAt: time.Now(), Rec: fx.rec})
	}()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(fx.ca.CertPEM())
	c := tls.Client(a, &tls.Config{RootCAs: roots, ServerName: "api.test", NextProtos: []string{"h2"}})
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	// The server writes while the client does, on a synchronous pipe: the
	// answers are read by their own framer, as they come.
	fr := http2.NewFramer(c, nil)
	type answer struct {
		id     uint32
		status string
	}
	answers := make(chan answer, 16)
	readErr := make(chan error, 1)
	go func() {
		rf := http2.NewFramer(nil, c)
		dec := hpack.NewDecoder(4096, nil)
		for {
			f, err := rf.ReadFrame()
			if err != nil {
				readErr <- err
				return
			}
			if h, ok := f.(*http2.HeadersFrame); ok {
				fs, _ := dec.DecodeFull(h.HeaderBlockFragment())
				for _, hf := range fs {
					if hf.Name == ":status" {
						answers <- answer{h.StreamID, hf.Value}
					}
				}
			}
		}
	}()
	fr.WriteSettings()
	headers := func(id uint32, extra ...string) {
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		f := append([]string{":method", "GET", ":scheme", "https", ":authority", "api.test", ":path", "/repos/acme/x"}, extra...)
		for i := 0; i+1 < len(f); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: f[i], Value: f[i+1]})
		}
		block := hb.Bytes()
		first := min(len(block), 16384)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:first], EndStream: true, EndHeaders: first == len(block)}); err != nil {
			t.Fatal(err)
		}
		for rest := block[first:]; len(rest) > 0; {
			k := min(len(rest), 16384)
			if err := fr.WriteContinuation(id, k == len(rest), rest[:k]); err != nil {
				t.Fatal(err)
			}
			rest = rest[k:]
		}
	}
	headers(1, "connection", "keep-alive")
	// A header list over the limit in fields of 4,000 bytes, so that it
	// goes over in the last frame (a CONTINUATION after it ends the
	// connection instead).
	var big []string
	for i := range 17 {
		big = append(big, fmt.Sprintf("x-big-%d", i), strings.Repeat("a", 4000))
	}
	headers(3, big...)
	headers(5)
	statuses := map[uint32]string{}
	for len(statuses) < 3 {
		select {
		case a := <-answers:
			statuses[a.id] = a.status
		case err := <-readErr:
			t.Fatalf("reading the answers (%v so far): %v", statuses, err)
		}
	}
	c.Close()
	if statuses[1] != "400" || statuses[3] != "431" || statuses[5] != "200" {
		t.Fatalf("answers by stream: %v, want 1: 400, 3: 431, 5: 200", statuses)
	}
	select {
	case <-fx.results:
	case <-time.After(10 * time.Second):
		t.Fatal("the flow did not end")
	}
	var local, served int
	for _, r := range fx.rec.all() {
		switch {
		case strings.Contains(r.Reason, "answered 2 request(s) of this connection itself"):
			local++
		case r.Status == 200:
			served++
		default:
			t.Errorf("unexpected record %+v", r)
		}
	}
	if local != 1 || served != 1 {
		t.Errorf("%d records of the requests answered locally (want 1), %d of the request served (want 1)", local, served)
	}
}
