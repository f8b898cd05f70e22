// burst: the benchmarks' HTTP client for bursts of concurrent requests (bench/burst.ts drives it).
//
// A Node client spends several milliseconds of its own event loop sending 64 requests and
// reading 64 answers on a machine whose cores it shares with the server under test, and that
// time lands in every latency it reports. This client keeps one goroutine and one kept-alive
// connection per concurrent request, with the request bytes built once, so a burst costs it a
// write and a read per connection.
//
// Usage: burst -url http://127.0.0.1:8080/v1/sandboxes -conns 64 [-method POST] [-header 'K: V']... [-body '{...}']
//
// It dials its connections, prints "ready", then reads commands from stdin, one per line:
//
//	burst   send one request on every connection at the same instant; print one JSON line:
//	        {"wallMs": …, "results": [{"ms": …, "status": 201, "body": "…"}, …]}
//
// It exits when stdin closes. A connection the server closed while idle is dialled again
// before the next burst; a request that fails is reported with status 0 and the error as
// its body, never retried (a retried claim could claim twice).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ", ") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

type result struct {
	Ms     float64 `json:"ms"`
	Status int     `json:"status"`
	Body   string  `json:"body"`
}

type conn struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
}

func (k *conn) dial() error {
	c, err := net.Dial("tcp", k.addr)
	if err != nil {
		return err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	k.c, k.r = c, bufio.NewReaderSize(c, 64<<10)
	return nil
}

// alive reports whether the server still holds the connection open: a read that times out at
// once means nothing is pending and the peer has not closed it.
func (k *conn) alive() bool {
	if k.c == nil {
		return false
	}
	_ = k.c.SetReadDeadline(time.Now().Add(time.Microsecond))
	_, err := k.r.Peek(1)
	_ = k.c.SetReadDeadline(time.Time{})
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (k *conn) ensure() error {
	if k.alive() {
		return nil
	}
	if k.c != nil {
		_ = k.c.Close()
	}
	return k.dial()
}

func (k *conn) roundTrip(req []byte) result {
	start := time.Now()
	res := result{}
	if _, err := k.c.Write(req); err != nil {
		res.Body = err.Error()
	} else if resp, err := http.ReadResponse(k.r, nil); err != nil {
		res.Body = err.Error()
	} else {
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		res.Status, res.Body = resp.StatusCode, string(body)
		if err != nil {
			res.Status, res.Body = 0, err.Error()
		}
	}
	res.Ms = float64(time.Since(start).Nanoseconds()) / 1e6
	if res.Status == 0 {
		_ = k.c.Close()
		k.c = nil
	}
	return res
}

func buildRequest(method string, u *url.URL, hs headers, body string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, u.RequestURI(), u.Host)
	for _, h := range hs {
		if !strings.Contains(h, ":") {
			return nil, fmt.Errorf("header %q: want 'Name: value'", h)
		}
		b.WriteString(h + "\r\n")
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n" + body)
	return []byte(b.String()), nil
}

func burst(conns []*conn, req []byte) ([]result, float64) {
	results := make([]result, len(conns))
	var ready, done sync.WaitGroup
	gate := make(chan struct{})
	ready.Add(len(conns))
	done.Add(len(conns))
	for i, k := range conns {
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			results[i] = k.roundTrip(req)
		}()
	}
	ready.Wait()
	start := time.Now()
	close(gate)
	done.Wait()
	return results, float64(time.Since(start).Nanoseconds()) / 1e6
}

func main() {
	rawURL := flag.String("url", "", "the URL every request goes to")
	method := flag.String("method", "GET", "the request method")
	body := flag.String("body", "", "the request body")
	n := flag.Int("conns", 1, "concurrent requests per burst, one connection each")
	var hs headers
	flag.Var(&hs, "header", "a request header, 'Name: value' (repeatable)")
	flag.Parse()
	u, err := url.Parse(*rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintf(os.Stderr, "burst: -url %q: want http://host:port/path\n", *rawURL)
		os.Exit(2)
	}
	if *n < 1 || *n > 4096 {
		fmt.Fprintf(os.Stderr, "burst: -conns %d: want 1..4096\n", *n)
		os.Exit(2)
	}
	req, err := buildRequest(*method, u, hs, *body)
	if err != nil {
		fmt.Fprintf(os.Stderr, "burst: %v\n", err)
		os.Exit(2)
	}
	conns := make([]*conn, *n)
	for i := range conns {
		conns[i] = &conn{addr: u.Host}
		if err := conns[i].dial(); err != nil {
			fmt.Fprintf(os.Stderr, "burst: dial %s: %v\n", u.Host, err)
			os.Exit(1)
		}
	}
	out := json.NewEncoder(os.Stdout)
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if cmd := strings.TrimSpace(in.Text()); cmd != "burst" {
			fmt.Fprintf(os.Stderr, "burst: unknown command %q (want burst)\n", cmd)
			os.Exit(2)
		}
		for _, k := range conns {
			if err := k.ensure(); err != nil {
				fmt.Fprintf(os.Stderr, "burst: dial %s: %v\n", u.Host, err)
				os.Exit(1)
			}
		}
		results, wallMs := burst(conns, req)
		if err := out.Encode(map[string]any{"wallMs": wallMs, "results": results}); err != nil {
			os.Exit(1)
		}
	}
}
