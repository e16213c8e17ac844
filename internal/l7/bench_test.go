package l7

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tunwall/tunwall/internal/testworld"
	"github.com/tunwall/tunwall/policy"
)

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// BenchmarkDownloadThroughTheTerminator reads a 64 MiB body through a
// terminated flow over loopback (TLS to the terminator, TLS from it), the cost
// tunwall adds to a download from a terminated host.
func BenchmarkDownloadThroughTheTerminator(b *testing.B) {
	const size = 64 << 20
	wca, _ := testworld.NewCA()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		io.Copy(w, io.LimitReader(zeros{}, size))
	}), TLSConfig: &tls.Config{GetCertificate: wca.GetCertificate}, ErrorLog: discardLog}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	p, _ := policy.Parse("p.yaml", []byte("version: 1\nphases: {e: {allow: [{host: dl.test, http: [{methods: [GET], paths: [\"/**\"]}]}]}}\n"))
	rs, _ := policy.Select(p, "", nil, policy.Guard{})
	ca, _ := NewCA(CAOptions{Permitted: []string{"dl.test"}})
	g, _ := New(Config{CA: ca, Rules: rs, Roots: wca.Pool()})
	front, _ := net.Listen("tcp", "127.0.0.1:0")
	defer front.Close()
	go func() {
		for {
			c, err := front.Accept()
			if err != nil {
				return
			}
			up, _ := net.Dial("tcp", ln.Addr().String())
			go g.Serve(context.Background(), Flow{Host: "dl.test", Port: 443, TLS: true, Client: c, Up: up, UpAt: time.Now(), Rec: &recorder{},
				Dial: func(ctx context.Context) (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }})
		}
	}()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return net.Dial("tcp", front.Addr().String())
		},
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "dl.test"},
	}}
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		resp, err := c.Get("https://dl.test/x")
		if err != nil {
			b.Fatal(err)
		}
		if n, _ := io.Copy(io.Discard, resp.Body); n != size {
			b.Fatalf("read %d", n)
		}
		resp.Body.Close()
	}
}
