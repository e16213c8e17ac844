package engine

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"github.com/tunwall/tunwall/internal/audit"
	"github.com/tunwall/tunwall/internal/sniff"
	"github.com/tunwall/tunwall/policy"
)

const (
	kindUnknown = iota
	kindTLS
	kindHTTP
)

// maxSniff bounds what is buffered while looking for a name: a ClientHello
// may span several TLS records up to 16 KiB, an HTTP head likewise.
const maxSniff = 17 << 10

type sniffed struct {
	buf      []byte // everything read from the client so far, to be sent on
	kind     int
	complete bool   // the ClientHello or request head was read whole
	host     string // normalized name, "" if none
	from     string // audit.HostFromSNI or audit.HostFromHTTP
}

// sniff reads the client's first bytes until it has a TLS ClientHello or an
// HTTP request head, sees that it is neither, the timeout passes, or spoke is
// closed (the server talked first: not TLS or HTTP). It never waits for a
// fixed time when the answer is already clear.
func (e *Engine) sniff(c net.Conn, spoke <-chan struct{}) sniffed {
	var sn sniffed
	buf := make([]byte, 0, 2048)
	c.SetReadDeadline(time.Now().Add(e.cfg.SniffTimeout))
	var (
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	if spoke != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-spoke:
				c.SetReadDeadline(time.Unix(1, 0))
			case <-stop:
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
		c.SetReadDeadline(time.Time{})
	}()
	for len(buf) < maxSniff {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(2*cap(buf), maxSniff))
			copy(nb, buf)
			buf = nb
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		sn.buf = buf
		if n > 0 && e.classify(&sn) {
			return sn
		}
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				e.log.Debug("sniff read", "err", err)
			}
			return sn
		}
	}
	return sn
}

// classify parses what has been read; it reports true when sniffing is over.
func (e *Engine) classify(sn *sniffed) bool {
	k, ok := sniff.Classify(sn.buf)
	if !ok {
		return false
	}
	switch k {
	case sniff.TLS:
		sn.kind = kindTLS
		var h sniff.Hello
		switch h.Parse(sn.buf) {
		case sniff.NeedMore:
			return false
		case sniff.Done:
			sn.complete = true
			if len(h.ServerName) > 0 && sniff.ValidHostname(h.ServerName) {
				if name, err := policy.NormalizeHost(string(h.ServerName)); err == nil {
					sn.host, sn.from = name, audit.HostFromSNI
				}
			}
		}
		return true
	case sniff.HTTP:
		sn.kind = kindHTTP
		var r sniff.Request
		switch r.Parse(sn.buf) {
		case sniff.NeedMore:
			return false
		case sniff.Done:
			sn.complete = true
			if len(r.Host) > 0 {
				if name, err := policy.NormalizeHost(string(r.Host)); err == nil {
					sn.host, sn.from = name, audit.HostFromHTTP
				}
			}
		}
		return true
	}
	return true
}

// prefetch reads the upstream's first bytes while the client is sniffed, so
// a server that speaks first (SSH, SMTP) ends sniffing at once.
type prefetch struct {
	c     net.Conn
	spoke chan struct{}
	buf   []byte
	err   error
	done  chan struct{}
}

func newPrefetch(c net.Conn) *prefetch {
	p := &prefetch{c: c, spoke: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		b := make([]byte, 16<<10)
		n, err := c.Read(b)
		p.buf, p.err = b[:n], err
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			close(p.spoke)
		}
	}()
	return p
}

// stop ends the prefetch and returns what the server sent, if anything.
func (p *prefetch) stop() []byte {
	p.c.SetReadDeadline(time.Unix(1, 0))
	<-p.done
	p.c.SetReadDeadline(time.Time{})
	return p.buf
}
