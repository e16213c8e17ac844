// Command twload is the benchmark client that runs inside each sandbox
// under test (tunwall, slirp4netns, pasta, or the kernel path). It talks to
// the test world's request/response and echo servers and prints one JSON
// object with what it measured.
//
//	twload cps  -addr IP:PORT -n N [-server-closes]  connect, request, response, close; N times in a row
//	twload rr   -addr IP:PORT -n N                   N request/responses on one open connection
//	twload hold -addr IP:PORT -n N -hold D           open N echo connections at once and hold them for D
//	twload https -url URL -n N [-connect IP:PORT]    N HTTPS GETs on one kept-alive connection (latency)
//	twload download -url URL [-connect IP:PORT]      one HTTPS GET, its body read to the end (throughput)
//
// HTTPS trusts the roots of SSL_CERT_FILE. -connect dials that address
// whatever the URL's name (for paths without tunwall's DNS).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"time"
)

type result struct {
	N       int     `json:"n"`
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
	fs.Parse(os.Args[2:])
	var r result
	switch os.Args[1] {
	case "cps":
		r = cps(*addr, *n, *serverCloses)
	case "rr":
		r = rr(*addr, *n)
	case "hold":
		r = holdConns(*addr, *n, *hold)
	case "https":
		r = httpsRR(client(*connect), *url, *n)
	case "download":
		r = download(client(*connect), *url)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	json.NewEncoder(os.Stdout).Encode(r)
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

// cps measures one connection at a time: connect, send a request, read the
// reply, and close (or read the server's close).
func cps(addr string, n int, serverCloses bool) result {
	r := result{N: n}
	lat := make([]time.Duration, 0, n)
	buf := make([]byte, 64)
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			r.Failed++
			continue
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		ok := false
		if _, err := c.Write([]byte("x")); err == nil {
			if m, err := io.ReadAtLeast(c, buf, 3); err == nil && string(buf[:m]) == "ok\n" {
				ok = true
				if serverCloses {
					if _, err := c.Read(buf); err != io.EOF {
						ok = false
					}
				}
			}
		}
		c.Close()
		if ok {
			lat = append(lat, time.Since(t0))
		} else {
			r.Failed++
		}
	}
	percentiles(&r, lat, time.Since(start))
	return r
}

// rr measures request/response latency on one open connection.
func rr(addr string, n int) result {
	r := result{N: n}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		r.Failed = n
		return r
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
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
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
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
	time.Sleep(hold)
	for _, c := range conns {
		c.Close()
	}
	r.Seconds = time.Since(start).Seconds()
	return r
}

// client is an HTTP/1.1 client with one connection, dialling connect
// when set.
func client(connect string) *http.Client {
	var d net.Dialer
	tr := &http.Transport{
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if connect != "" {
				addr = connect
			}
			c, err := d.DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
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
