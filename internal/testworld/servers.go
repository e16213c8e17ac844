package testworld

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// DefaultNames is the world resolver's zone.
func DefaultNames() map[string][]netip.Addr {
	m := map[string][]netip.Addr{
		"allowed.test":            {Web4, Web6},
		"www.allowed.test":        {Web4, Web6},
		"api.allowed.test":        {API4, API6},
		"a.cdn.allowed.test":      {Web4, Web6},
		"b.cdn.allowed.test":      {Web4, Web6},
		"c.cdn.allowed.test":      {Web4, Web6},
		"deep.a.cdn.allowed.test": {Web4, Web6},
		"evilallowed.test":        {Evil4, Evil6},
		"other.test":              {Web4, Web6},
		"api.other.test":          {API4, API6},
		"denied.test":             {Evil4, Evil6},
		"evil.test":               {Evil4, Evil6},
		"echo.test":               {Echo4, Echo6},
		"refused.test":            {Refuse4, Refuse6},
		"blackhole.test":          {Blackhole4, Blackhole6},
		"blackhole4.test":         {Blackhole4},
		// Every address of a name gets a try (Happy Eyeballs): the first
		// A record blackholes, the second answers; the AAAA blackholes
		// while the A answers.
		"first-dead.test":      {Blackhole4, Web4},
		"v6-dead.test":         {Blackhole6, Web4},
		"v4only.test":          {Web4},
		"rebind-lo.test":       {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")},
		"rebind-private.test":  {Private4},
		"rebind-metadata.test": {Metadata4},
		"rebind-self.test":     {AgentVeth4},
		"rebind-mapped.test":   {netip.MustParseAddr("::ffff:127.0.0.1")},
		"rebind-mixed.test":    {netip.MustParseAddr("127.0.0.1"), Web4},
	}
	return m
}

// DNSServer is the world's resolver. It logs every question it receives, so
// tests can prove a name never reached it.
type DNSServer struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
	log   []Question
	srvs  []*dns.Server
}

// Question is one query the world's resolver received.
type Question struct {
	Name string // lower-case, no trailing dot
	Type string
	// Query is the whole message as it arrived (name case, header flags,
	// EDNS0 OPT record and options), for tests of what tunwall sends.
	Query *dns.Msg
}

// Set replaces name's addresses.
func (d *DNSServer) Set(name string, addrs ...netip.Addr) {
	d.mu.Lock()
	d.names[strings.ToLower(strings.TrimSuffix(name, "."))] = addrs
	d.mu.Unlock()
}

// Log returns every question received so far.
func (d *DNSServer) Log() []Question {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Question(nil), d.log...)
}

// Asked reports whether name was ever asked about (any type).
func (d *DNSServer) Asked(name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, q := range d.Log() {
		if q.Name == name || strings.HasSuffix(q.Name, "."+name) {
			return true
		}
	}
	return false
}

// ServFailName (and every name under it) is answered SERVFAIL by the
// world's DNS server, whatever the type.
const ServFailName = "servfail.test"

func (d *DNSServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	d.mu.Lock()
	d.log = append(d.log, Question{Name: name, Type: dns.TypeToString[q.Qtype], Query: r.Copy()})
	addrs, ok := d.names[name]
	d.mu.Unlock()
	if name == ServFailName || strings.HasSuffix(name, "."+ServFailName) {
		// A resolver that fails: what an upstream whose own upstream
		// is down answers.
		m.Rcode = dns.RcodeServerFailure
		w.WriteMsg(m)
		return
	}
	if !ok {
		m.Rcode = dns.RcodeNameError
		w.WriteMsg(m)
		return
	}
	hdr := func(t uint16) dns.RR_Header {
		return dns.RR_Header{Name: q.Name, Rrtype: t, Class: dns.ClassINET, Ttl: 30}
	}
	switch q.Qtype {
	case dns.TypeA, dns.TypeAAAA:
		for _, a := range addrs {
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr(dns.TypeA), A: a.AsSlice()})
			case q.Qtype == dns.TypeAAAA && !a.Is4():
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr(dns.TypeAAAA), AAAA: a.AsSlice()})
			}
		}
	case dns.TypeTXT:
		m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr(dns.TypeTXT), Txt: []string{"world says hello to " + name}})
	case dns.TypeMX:
		m.Answer = append(m.Answer, &dns.MX{Hdr: hdr(dns.TypeMX), Preference: 10, Mx: "mail." + name + "."})
	}
	w.WriteMsg(m)
}

func (w *World) startServers(opts Options) error {
	if err := w.startDNS(opts.Names); err != nil {
		return err
	}

	// Web servers: HTTP and HTTPS for any name.
	for _, ip := range []netip.Addr{Web4, Web6, API4, API6} {
		server := "web"
		if ip == API4 || ip == API6 {
			server = "api"
		}
		if err := w.serveHTTP(server, ip, 80, false); err != nil {
			return err
		}
		if err := w.serveHTTP(server, ip, 443, true); err != nil {
			return err
		}
		if err := w.serveHTTP(server, ip, 8443, true); err != nil {
			return err
		}
	}
	// Places that must never be reached: they log every arrival.
	for _, s := range []struct {
		server string
		ip     netip.Addr
	}{
		{"evil", Evil4}, {"evil", Evil6}, {"metadata", Metadata4}, {"private", Private4},
	} {
		for _, port := range []uint16{80, 443} {
			if err := w.serveHTTP(s.server, s.ip, port, port == 443); err != nil {
				return err
			}
		}
		if err := w.serveUDPLog(s.server, netip.AddrPortFrom(s.ip, 7)); err != nil {
			return err
		}
	}
	if err := w.serveUDPLog("evil", netip.AddrPortFrom(Evil4, 53)); err != nil {
		return err
	}
	// The agent's own loopback and veth address.
	for _, s := range []struct {
		server string
		ip     netip.Addr
	}{
		{"agent-lo", netip.MustParseAddr("127.0.0.1")},
		{"agent-lo", netip.MustParseAddr("::1")},
		{"agent-veth", AgentVeth4},
	} {
		if err := w.serveHTTPIn(w.InAgent, s.server, s.ip, uint16(AgentLocalPort), false); err != nil {
			return err
		}
		if err := w.serveHTTPIn(w.InAgent, s.server, s.ip, 443, true); err != nil {
			return err
		}
	}
	// Echo host: TCP echo, sink, source, request/response; UDP echo.
	for _, ip := range []netip.Addr{Echo4, Echo6} {
		for port, h := range map[uint16]func(net.Conn){
			7:  echoConn,
			9:  sinkConn,
			19: sourceConn,
			80: rrConn(false),
			81: rrConn(true),
			// 82 as 80, for a second connection-rate measurement: a
			// client gets at most one ephemeral port per destination
			// for each connection in TIME_WAIT (60 s), and past about
			// half of them (connect(2) tries one parity first) every
			// connect searches them all.
			82: rrConn(false),
		} {
			if err := w.serveTCP(netip.AddrPortFrom(ip, port), h); err != nil {
				return err
			}
		}
		if err := w.serveUDPEcho(netip.AddrPortFrom(ip, 7)); err != nil {
			return err
		}
	}
	return nil
}

// startDNS starts the world's DNS server (DefaultNames plus extra) on
// DNS4 and DNS6, port 53, UDP and TCP.
func (w *World) startDNS(extra map[string][]netip.Addr) error {
	names := DefaultNames()
	for k, v := range extra {
		names[k] = v
	}
	w.DNS = &DNSServer{names: names}
	for _, ip := range []netip.Addr{DNS4, DNS6} {
		addr := netip.AddrPortFrom(ip, 53).String()
		pc, err := w.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		l, err := w.Listen("tcp", addr)
		if err != nil {
			pc.Close()
			return err
		}
		for _, s := range []*dns.Server{{PacketConn: pc, Handler: w.DNS}, {Listener: l, Handler: w.DNS}} {
			started := make(chan struct{})
			s.NotifyStartedFunc = func() { close(started) }
			go s.ActivateAndServe()
			<-started
			w.DNS.srvs = append(w.DNS.srvs, s)
			w.closers = append(w.closers, func() { s.Shutdown() })
		}
	}
	return nil
}

func (w *World) serveTCP(ap netip.AddrPort, h func(net.Conn)) error {
	l, err := w.Listen("tcp", ap.String())
	if err != nil {
		return err
	}
	w.closers = append(w.closers, func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go h(c)
		}
	}()
	return nil
}

// echoConn echoes bytes until EOF. It copies through a buffer of its own:
// io.Copy(c, c) on a TCP conn splices through a pipe, three descriptors per
// connection, which caps the world's concurrent echo connections at a third
// of the descriptor limit (the load tests hold 10,000).
func echoConn(c net.Conn) {
	defer c.Close()
	io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 16<<10))
}

// sinkConn reads until EOF, then writes "<bytes> <sha256>\n".
func sinkConn(c net.Conn) {
	defer c.Close()
	h := sha256.New()
	n, _ := io.Copy(h, c)
	fmt.Fprintf(c, "%d %s\n", n, hex.EncodeToString(h.Sum(nil)))
}

// sourceConn reads a line "N SEED\n" and sends N bytes of Stream(SEED).
func sourceConn(c net.Conn) {
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	seed, _ := strconv.ParseUint(f[1], 10, 64)
	io.Copy(c, io.LimitReader(Stream(seed), n))
}

// rrConn answers each request chunk with a short reply. With serverCloses it
// answers one request and closes first.
func rrConn(serverCloses bool) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, err := c.Write([]byte("ok\n")); err != nil {
					return
				}
				if serverCloses {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
}

func (w *World) serveUDPEcho(ap netip.AddrPort) error { return w.serveUDPLog("", ap) }

// serveUDPLog echoes datagrams, recording each arrival under server unless
// server is "".
func (w *World) serveUDPLog(server string, ap netip.AddrPort) error {
	pc, err := w.ListenPacket("udp", ap.String())
	if err != nil {
		return err
	}
	w.closers = append(w.closers, func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if server != "" {
				w.record(Arrival{Server: server, Proto: "udp", Local: ap, Remote: from.(*net.UDPAddr).AddrPort()})
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return nil
}

func (w *World) serveHTTP(server string, ip netip.Addr, port uint16, useTLS bool) error {
	return w.serveHTTPIn(w.InWorld, server, ip, port, useTLS)
}

// serveHTTPIn runs a logging HTTP(S) server. Every request is logged (proto
// "http" or "https", with its Host) and answered with "<server> <host>
// <path>"; /bytes/N sends N bytes of Stream(1); POST /sha256 answers with
// the body's length and SHA-256; /ws switches protocols (101) for an
// Upgrade: websocket request and then echoes bytes. Plain HTTP servers also
// speak HTTP/2 with prior knowledge (h2c).
func (w *World) serveHTTPIn(in func(func() error) error, server string, ip netip.Addr, port uint16, useTLS bool) error {
	ap := netip.AddrPortFrom(ip, port)
	var l net.Listener
	if err := in(func() (err error) {
		l, err = net.Listen("tcp", ap.String())
		return err
	}); err != nil {
		return err
	}
	mux := httpEndpoints(server)
	proto := "http"
	if useTLS {
		proto = "https"
	}
	// Every request is logged with the Host it named, so a test can prove
	// that a request for a forbidden name never reached a server.
	logged := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		a := Arrival{Server: server, Proto: proto, Local: ap, Host: r.Host}
		if ra, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			a.Remote = ra
		}
		w.record(a)
		mux.ServeHTTP(rw, r)
	})
	srv := &http.Server{
		Handler:           logged,
		ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(c net.Conn, st http.ConnState) {
			if st != http.StateNew {
				return
			}
			a := Arrival{Server: server, Proto: "tcp", Local: ap}
			if ra, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				a.Remote = ra.AddrPort()
			}
			w.record(a)
		},
		ErrorLog: log.New(io.Discard, "", 0), // clients that hang up mid-handshake are expected
	}
	srv.SetKeepAlivesEnabled(true)
	if !useTLS {
		// HTTP/2 with prior knowledge (h2c) as well as HTTP/1.1, as many
		// servers behind one address do.
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	if useTLS {
		srv.TLSConfig = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			w.record(Arrival{Server: server, Proto: "tls", Local: ap, Host: h.ServerName})
			return w.CA.GetCertificate(h)
		}}
		l = tls.NewListener(l, srv.TLSConfig)
	}
	w.closers = append(w.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		srv.Close()
	})
	go srv.Serve(l)
	return nil
}

// httpEndpoints is what every HTTP(S) server of the world serves, as
// server: /bytes/N (N bytes of Stream(1)), POST /sha256 (the body's length
// and SHA-256), /ws (a raw-echo stand-in for a WebSocket), and anything
// else answered with server, Host and path.
func httpEndpoints(server string) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/bytes/{n}", func(rw http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.PathValue("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(rw, "bad length", http.StatusBadRequest)
			return
		}
		rw.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.Copy(rw, io.LimitReader(Stream(1), n))
	})
	mux.HandleFunc("POST /sha256", func(rw http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(rw, "%d %s\n", n, hex.EncodeToString(h.Sum(nil)))
	})
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "%s %s %s\n", server, r.Host, r.URL.Path)
	})
	// /ws switches protocols when asked to (Upgrade: websocket) and then
	// echoes raw bytes: enough of a WebSocket for a test to tell an
	// upgraded connection from an HTTP one.
	mux.HandleFunc("/ws", func(rw http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			fmt.Fprintf(rw, "%s %s %s not upgraded\n", server, r.Host, r.URL.Path)
			return
		}
		c, brw, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	})
	return mux
}

// Stream returns an endless deterministic byte stream for seed, fast enough
// for multi-gigabyte transfers.
func Stream(seed uint64) io.Reader {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return rand.NewChaCha8(s)
}
