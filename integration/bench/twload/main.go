// Command twload is the benchmark client that runs inside each sandbox
// under test (tunwall, slirp4netns, pasta, or the kernel path). It talks to
// the test world's request/response and echo servers and prints one JSON
// object with what it measured.
//
//	twload cps  -addr IP:PORT -n N [-server-closes] [-workers W]
//	                                                 connect, request, response, close; N times in a row
//	                                                 (by each of W workers at once: N in all)
//	twload rr   -addr IP:PORT -n N                   N request/responses on one open connection
//	twload hold -addr IP:PORT -n N -hold D           open N echo connections at once and hold them for D
//	twload https -url URL -n N [-connect IP:PORT]    N HTTPS GETs on one kept-alive connection (latency)
//	twload download -url URL [-connect IP:PORT]      one HTTPS GET, its body read to the end (throughput)
//	twload many -addr IP:PORT -n N -hold D           open N echo connections (64 connecting at once),
//	                                                 each sending a record every 5 s, hold them for D;
//	                                                 driven by lines on stdin (see many)
//	twload dnsfirst -addr IP:53 -n N -name NAME      start N processes one after another, each sending
//	                                                 one DNS query (A NAME, UDP) and exiting; the latency
//	                                                 is each one's, from opening its socket to the answer
//
// HTTPS trusts the roots of SSL_CERT_FILE. -connect dials that address
// whatever the URL's name (for paths without tunwall's DNS).
//
// -proxy HOST:PORT makes every TCP connection of cps, rr, hold, many, https
// and download through that HTTP proxy (CONNECT to the -addr, or to the
// URL's own host:port, which the proxy resolves): the tinyproxy recipe's
// path, whose sandbox reaches nothing but its proxy.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type result struct {
	N int `json:"n"`
	// Unix times (ns) of hold: before its first connect, once every
	// connection is open and echoed, and at the end of the hold (for the
	// bench to read the path's memory at those points).
	StartNs int64   `json:"start_ns,omitempty"`
	HeldNs  int64   `json:"held_ns,omitempty"`
	EndNs   int64   `json:"end_ns,omitempty"`
	Failed  int     `json:"failed"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"per_sec"`
	P50us   float64 `json:"p50_us"`
	P99us   float64 `json:"p99_us"`
	Gbps    float64 `json:"gbps,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: twload cps|rr|hold [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	addr := fs.String("addr", "", "server ip:port")
	n := fs.Int("n", 1000, "iterations or connections")
	serverCloses := fs.Bool("server-closes", false, "the server closes first (cps)")
	hold := fs.Duration("hold", time.Second, "how long to hold connections (hold)")
	url := fs.String("url", "", "URL (https, download)")
	connect := fs.String("connect", "", "dial this ip:port whatever the URL's name (https, download)")
	workers := fs.Int("workers", 1, "connections made at once (cps)")
	name := fs.String("name", "allowed.test", "name to look up (dnsfirst)")
	fs.StringVar(&proxy, "proxy", "", "make TCP connections through this HTTP CONNECT proxy (host:port)")
	fs.Parse(os.Args[2:])
	var r result
	switch os.Args[1] {
	case "cps":
		r = cps(*addr, *n, *serverCloses, *workers)
	case "rr":
		r = rr(*addr, *n)
	case "hold":
		r = holdConns(*addr, *n, *hold)
	case "https":
		r = httpsRR(client(*connect), *url, *n)
	case "download":
		r = download(client(*connect), *url)
	case "dnsfirst":
		r = dnsFirst(*addr, *n, *name)
	case "dnsone":
		// One process of dnsfirst: prints its latency in µs, or fails.
		d, err := dnsOnce(*addr, *name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(d.Microseconds())
		return
	case "many":
		json.NewEncoder(os.Stdout).Encode(many(*addr, *n, *hold))
		waitLine() // the caller samples the path at rest, then lets us exit
		return
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// proxy is -proxy: empty to dial directly.
var proxy string

// dial connects to addr directly, or through the CONNECT proxy.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if proxy == "" {
		return d.DialContext(ctx, "tcp", addr)
	}
	c, err := d.DialContext(ctx, "tcp", proxy)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("proxy: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("proxy: CONNECT %s: %s", addr, resp.Status)
	}
	c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufConn{c, br}, nil
	}
	return c, nil
}

// dialTimeout is dial with a timeout.
func dialTimeout(addr string, d time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return dial(ctx, addr)
}

// bufConn is a proxied connection whose first bytes the proxy's answer's
// reader already holds.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// setNoDelay turns Nagle off on a direct connection or on the connection to
// the proxy.
func setNoDelay(c net.Conn) {
	if b, ok := c.(*bufConn); ok {
		c = b.Conn
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

func percentiles(r *result, lat []time.Duration, total time.Duration) {
	r.Seconds = total.Seconds()
	if total > 0 {
		r.PerSec = float64(len(lat)) / total.Seconds()
	}
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(p float64) float64 {
		i := int(p * float64(len(lat)-1))
		return float64(lat[i].Nanoseconds()) / 1e3
	}
	r.P50us, r.P99us = at(0.50), at(0.99)
}

// cps measures connections made one after another by each of workers
// goroutines (n in all): connect, send a request, read the reply, and close
// (or read the server's close).
func cps(addr string, n int, serverCloses bool, workers int) result {
	r := result{N: n}
	workers = max(1, min(workers, n))
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			mine := make([]time.Duration, 0, n/workers+1)
			failed := 0
			for i := w; i < n; i += workers {
				t0 := time.Now()
				if connectOnce(addr, buf, serverCloses) {
					mine = append(mine, time.Since(t0))
				} else {
					failed++
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			r.Failed += failed
			mu.Unlock()
		}()
	}
	wg.Wait()
	percentiles(&r, lat, time.Since(start))
	return r
}

// connectOnce makes one connection of cps and reports whether it went as
// it should.
func connectOnce(addr string, buf []byte, serverCloses bool) bool {
	c, err := dialTimeout(addr, 5*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("x")); err != nil {
		return false
	}
	m, err := io.ReadAtLeast(c, buf, 3)
	if err != nil || string(buf[:m]) != "ok\n" {
		return false
	}
	if serverCloses {
		if _, err := c.Read(buf); err != io.EOF {
			return false
		}
	}
	return true
}

// rr measures request/response latency on one open connection.
func rr(addr string, n int) result {
	r := result{N: n}
	c, err := dialTimeout(addr, 5*time.Second)
	if err != nil {
		r.Failed = n
		return r
	}
	defer c.Close()
	setNoDelay(c)
	lat := make([]time.Duration, 0, n)
	buf := make([]byte, 64)
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			r.Failed += n - i
			break
		}
		if _, err := io.ReadAtLeast(c, buf, 3); err != nil {
			r.Failed += n - i
			break
		}
		lat = append(lat, time.Since(t0))
	}
	percentiles(&r, lat, time.Since(start))
	return r
}

// holdConns opens n echo connections, checks each echoes, and holds them.
func holdConns(addr string, n int, hold time.Duration) result {
	r := result{N: n}
	conns := make([]net.Conn, 0, n)
	start := time.Now()
	r.StartNs = start.UnixNano()
	for i := 0; i < n; i++ {
		c, err := dialTimeout(addr, 10*time.Second)
		if err != nil {
			r.Failed++
			continue
		}
		conns = append(conns, c)
	}
	msg := make([]byte, 1024)
	buf := make([]byte, 1024)
	for _, c := range conns {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			r.Failed++
			continue
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			r.Failed++
		}
	}
	r.HeldNs = time.Now().UnixNano()
	time.Sleep(hold)
	r.EndNs = time.Now().UnixNano()
	for _, c := range conns {
		c.Close()
	}
	r.Seconds = time.Since(start).Seconds()
	return r
}

// client is an HTTP/1.1 client with one connection, dialling connect
// when set.
func client(connect string) *http.Client {
	tr := &http.Transport{
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			// Through a proxy, CONNECT names the URL's host: the
			// proxy resolves it and filters by it.
			if connect != "" && proxy == "" {
				addr = connect
			}
			c, err := dial(ctx, addr)
			if err == nil {
				setNoDelay(c)
			}
			return c, err
		},
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// httpsRR measures HTTPS request/response latency on one kept-alive
// connection (the first request, which sets it up, is not counted).
func httpsRR(c *http.Client, url string, n int) result {
	r := result{N: n}
	get := func() bool {
		resp, err := c.Get(url)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	if !get() {
		r.Failed = n
		return r
	}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if !get() {
			r.Failed++
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	percentiles(&r, lat, time.Since(start))
	return r
}

// download reads one response body to its end and reports the rate.
func download(c *http.Client, url string) result {
	r := result{N: 1}
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		r.Failed = 1
		return r
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	el := time.Since(start)
	if err != nil || resp.StatusCode != 200 {
		r.Failed = 1
	}
	r.Seconds = el.Seconds()
	r.Gbps = float64(n) * 8 / el.Seconds() / 1e9
	return r
}

// manyResult is what many prints.
type manyResult struct {
	N          int     `json:"n"`
	Failed     int     `json:"failed"`  // connects that failed (refused, timed out)
	Stalled    int     `json:"stalled"` // connections whose record was not echoed within 10 s
	Records    int     `json:"records"` // records echoed
	ConnectSec float64 `json:"connect_seconds"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	TUNTx      int64   `json:"tun_tx"`      // packets the sandbox sent into tun0 while it opened and held the connections (-1: no tun0)
	TUNDropped int64   `json:"tun_dropped"` // packets tun0 dropped meanwhile (tunwall did not read them in time)
}

func waitLine() {
	var b [1]byte
	for {
		if n, err := os.Stdin.Read(b[:]); err != nil || (n == 1 && b[0] == '\n') {
			return
		}
	}
}

// tunStats returns tun0's transmit packets and drops from /proc/net/dev
// (this network namespace's), or -1, -1 without a tun0.
func tunStats() (tx, dropped int64) {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return -1, -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(name) != "tun0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 12 {
			return -1, -1
		}
		tx, _ = strconv.ParseInt(f[9], 10, 64)
		dropped, _ = strconv.ParseInt(f[11], 10, 64)
		return tx, dropped
	}
	return -1, -1
}

// many prints "ready" and waits for a line on stdin; then opens n echo
// connections, at most 64 connecting at once, and holds them for hold
// after the last one is open, each sending a 32-byte record every 5 s
// (the first at a random point of its first 5 s) and waiting for its echo.
// It prints "held" once every connection is open, closes them all at the
// end and returns what it saw.
func many(addr string, n int, hold time.Duration) manyResult {
	const every, inflight, stallAfter = 5 * time.Second, 64, 10 * time.Second
	fmt.Println("ready")
	waitLine()
	r := manyResult{N: n}
	tx0, drop0 := tunStats()
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	conns := make([]net.Conn, 0, n)
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			c, err := dialTimeout(addr, 10*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Failed++
				return
			}
			lat = append(lat, time.Since(t0))
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	r.ConnectSec = time.Since(start).Seconds()
	fmt.Println("held")
	end := time.Now().Add(hold)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now().Add(time.Duration(i) * every / time.Duration(len(conns)))
			msg := []byte(fmt.Sprintf("record %08d ..................\n", i))[:32]
			buf := make([]byte, 32)
			for next.Before(end) {
				time.Sleep(time.Until(next))
				c.SetDeadline(time.Now().Add(stallAfter))
				if _, err := c.Write(msg); err != nil {
					break
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					break
				}
				mu.Lock()
				r.Records++
				mu.Unlock()
				next = next.Add(every)
			}
			if next.Before(end) {
				mu.Lock()
				r.Stalled++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// The TUN's figures of the connect and hold phases; closing them all
	// at once is a burst of its own.
	tx1, drop1 := tunStats()
	for _, c := range conns {
		c.Close()
	}
	r.TUNTx, r.TUNDropped = -1, -1
	if tx0 >= 0 && tx1 >= 0 {
		r.TUNTx, r.TUNDropped = tx1-tx0, drop1-drop0
	}
	slices.Sort(lat)
	at := func(p float64) float64 {
		if len(lat) == 0 {
			return -1
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1e3
	}
	r.P50ms, r.P99ms, r.MaxMs = at(0.5), at(0.99), at(1)
	return r
}

// dnsFirst starts n processes (this program, "dnsone") one after another;
// each opens a UDP socket, sends one query and exits once answered. What
// it measures is each process's own time from opening its socket to the
// answer: the wait of a process the path has never seen before.
func dnsFirst(addr string, n int, name string) result {
	r := result{N: n}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		r.Failed = n
		return r
	}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, self, "dnsone", "-addr", addr, "-name", name).Output()
		cancel()
		us, perr := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil || perr != nil {
			r.Failed++
			continue
		}
		lat = append(lat, time.Duration(us)*time.Microsecond)
	}
	percentiles(&r, lat, time.Since(start))
	return r
}

// dnsOnce sends one query for name's A records to addr over UDP and
// returns the time from opening the socket to a matching answer.
func dnsOnce(addr, name string) (time.Duration, error) {
	var id [2]byte
	rand.Read(id[:])
	q := append([]byte{id[0], id[1], 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}, encodeName(name)...)
	q = append(q, 0, 1, 0, 1) // A, IN
	t0 := time.Now()
	c, err := net.Dial("udp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(t0.Add(5 * time.Second))
	if _, err := c.Write(q); err != nil {
		return 0, err
	}
	buf := make([]byte, 1500)
	for {
		m, err := c.Read(buf)
		if err != nil {
			return 0, err
		}
		if m >= 12 && binary.BigEndian.Uint16(buf) == binary.BigEndian.Uint16(id[:]) && buf[2]&0x80 != 0 {
			if rcode := buf[3] & 0xf; rcode != 0 {
				return 0, fmt.Errorf("answer with rcode %d", rcode)
			}
			return time.Since(t0), nil
		}
		if m < 12 {
			return 0, errors.New("short answer")
		}
	}
}

// encodeName encodes a domain name in DNS wire form.
func encodeName(name string) []byte {
	var b []byte
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}
