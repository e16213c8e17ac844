package integration

import (
	"strings"
	"testing"

	"github.com/tunwall/tunwall/internal/audit"
)

// reflectUpgrade is run by python3 in the sandbox: a WebSocket upgrade to
// api.creds.test/reflect/upgrade over TLS (HTTP/1.1), with the
// Authorization given as argv[1] ("" for none); it prints what came back
// until the server closes (bounded in time and size).
const reflectUpgrade = `
import socket, ssl, sys
auth = sys.argv[1]
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection(("api.creds.test", 443), timeout=10), server_hostname="api.creds.test")
req = "GET /reflect/upgrade HTTP/1.1\r\nHost: api.creds.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
if auth:
    req += "Authorization: " + auth + "\r\n"
s.sendall((req + "\r\n").encode())
out = b""
try:
    while len(out) < 65536:
        b = s.recv(4096)
        if not b:
            break
        out += b
except Exception as e:
    out += ("<%s>" % e).encode()
print(out.decode("latin-1"))
`

// TestCredsNoResponsePathHandsTheValueBack attacks every place other than
// a header and the body where a response carries bytes to the sandbox:
// api.creds.test/reflect/ echoes the injected Authorization in a declared
// trailer, in a trailer announced nowhere, in the headers of a 103 Early
// Hints, in a header's name, and (to a WebSocket upgrade) in the 101's
// reason phrase, a header and the bytes after it, asked over HTTP/1.1 and
// HTTP/2 by curl and by python. The value never reaches the sandbox in any
// of them (nor case-folded): it is masked where it can be, and an upgrade
// of a request that received a secret is refused (the bytes after a 101
// are a protocol tunwall does not read); the http records say so.
func TestCredsNoResponsePathHandsTheValueBack(t *testing.T) {
	requireTools(t, "curl", "python3")
	cw := newCredsWorld(t, 0)
	script := `
for v in --http1.1 --http2; do
  for p in trailer undeclared early-hints header-name; do
    echo "== $v $p"
    curl -sS -v --raw $v --max-time 10 https://api.creds.test/reflect/$p -H "Authorization: token $GITHUB_TOKEN" 2>&1 | grep -v '^\*' | tr -d '\r'
  done
  echo "== $v basic-trailer"
  curl -sS -v --raw $v --max-time 10 -u "x-access-token:$GITHUB_TOKEN" https://api.creds.test/reflect/trailer 2>&1 | grep -v '^\*' | tr -d '\r'
done
echo "== upgrade"
python3 -c '` + reflectUpgrade + `' "token $GITHUB_TOKEN" | tr -d '\r'
echo "== upgrade-without-secret"
python3 -c '` + reflectUpgrade + `' "" | tr -d '\r'
echo "== end"
`
	r := cw.run(runOpts{script: script})
	if r.code != 0 {
		t.Fatalf("the sandbox failed\n%s", r)
	}
	t.Logf("what the sandbox got back:\n%s", r.stdout)
	noValue(t, "what the sandbox got back", r.stdout)
	if strings.Contains(strings.ToLower(r.stdout), strings.ToLower(credsToken)) {
		t.Errorf("the value reached the sandbox case-folded")
	}
	sections := map[string]string{}
	for _, s := range strings.Split(r.stdout, "== ")[1:] {
		name, body, _ := strings.Cut(s, "\n")
		sections[name] = strings.ToLower(body)
	}
	stars := strings.Repeat("*", len(credsToken))
	want := map[string][]string{
		"trailer":       {"x-echo-trailer: token " + stars, "reflect: "},
		"undeclared":    {"x-echo-undeclared: token " + stars, "reflect: "},
		"early-hints":   {" 103", "x-echo-hint: token " + stars, "link: </style.css?t=" + stars + ">", "reflect: "},
		"header-name":   {"x-" + stars + ": reflected", "reflect: "},
		"basic-trailer": {"x-echo-trailer: basic ", "********", "reflect: "},
	}
	for _, v := range []string{"--http1.1", "--http2"} {
		for p, ws := range want {
			got, ok := sections[v+" "+p]
			if !ok {
				t.Errorf("%s %s: no output", v, p)
				continue
			}
			for _, w := range ws {
				if !strings.Contains(got, w) {
					t.Errorf("%s %s: %q is not in what the client got:\n%s", v, p, w, got)
				}
			}
		}
	}
	up := sections["upgrade"]
	if !strings.HasPrefix(up, "http/1.1 403") || !strings.Contains(up, "upgrade") || strings.Contains(up, "after the upgrade") {
		t.Errorf("the upgrade of a request that received the secret was not refused:\n%s", up)
	}
	if free := sections["upgrade-without-secret"]; !strings.HasPrefix(free, "http/1.1 101") || !strings.Contains(free, "after the upgrade:") {
		t.Errorf("an upgrade that received no secret was not relayed:\n%s", free)
	}

	// The records: each reflected value was masked (2 protocols x 5
	// requests), the upgrade refused.
	var masked, refused int
	for _, rec := range httpRecords(t, r.audit) {
		if !strings.HasPrefix(rec.Path, "/reflect/") {
			continue
		}
		switch {
		case strings.Contains(rec.Reason, "the response carried the value of GITHUB_TOKEN, masked"):
			masked++
		case rec.Path == "/reflect/upgrade" && rec.Verdict == audit.VerdictDeny && strings.Contains(rec.Reason, "upgrade"):
			refused++
		}
	}
	if masked != 10 || refused != 1 {
		t.Errorf("%d records say a value was masked (want 10), %d an upgrade was refused (want 1)", masked, refused)
	}
	noValueAnywhere(t, r)
}
