package approve

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// spawn starts script under sh as cmd/tunwall does: stdin and stdout on
// socket pairs, in a process group of its own.
func spawn(t *testing.T, script string, stderr *syncBuf) DeciderIO {
	t.Helper()
	pair := func() (*os.File, *os.File) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
	}
	in, inChild := pair()
	out, outChild := pair()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inChild, outChild, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inChild.Close()
	outChild.Close()
	return DeciderIO{In: in, Out: out, Kill: func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }, Wait: cmd.Wait}
}

// syncBuf is a strings.Builder safe for the decider's stderr copier.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func start(t *testing.T, script string) (*Queue, *syncBuf) {
	t.Helper()
	var said syncBuf
	q, err := New(Config{Decider: NewProcess(spawn(t, script, &said), 0), Stderr: &said, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	return q, &said
}

func ask(q *Queue, host string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, _ := q.Ask(ctx, Request{Phase: "exec", Proto: ProtoDNS, Host: host})
	return d.Allowed(), d.Reason
}

func TestADeciderAnswersByID(t *testing.T) {
	// Allows names starting with "ok", denies the rest.
	q, _ := start(t, `while read -r line; do
id=$(printf '%s' "$line" | sed 's/.*"id":"\([^"]*\)".*/\1/')
case "$line" in *'"host":"ok'*) v=allow;; *) v=deny;; esac
printf '{"id":"%s","verdict":"%s","scope":"run","reason":"sh says"}\n' "$id" "$v"
done`)
	if ok, why := ask(q, "ok.example.com"); !ok {
		t.Errorf("ok.example.com denied: %s", why)
	}
	if ok, why := ask(q, "no.example.com"); ok || !strings.Contains(why, "sh says") {
		t.Errorf("no.example.com: %v %s", ok, why)
	}
}

func TestADeciderWritingGarbageIsDeadAndSaidOnce(t *testing.T) {
	q, said := start(t, `while read -r line; do echo 'yes please'; done`)
	if ok, _ := ask(q, "a.example.com"); ok {
		t.Fatal("allowed on garbage")
	}
	if ok, _ := ask(q, "b.example.com"); ok {
		t.Fatal("allowed after garbage")
	}
	if n := strings.Count(said.String(), "tunwall: --decider"); n != 1 {
		t.Errorf("said %d times:\n%s", n, said.String())
	}
}

func TestADeciderAnsweringAnotherVerdictOrScopeIsGarbage(t *testing.T) {
	q, said := start(t, `while read -r line; do
id=$(printf '%s' "$line" | sed 's/.*"id":"\([^"]*\)".*/\1/')
printf '{"id":"%s","verdict":"allow","scope":"forever"}\n' "$id"
done`)
	if ok, _ := ask(q, "a.example.com"); ok {
		t.Fatal("allowed with an unknown scope")
	}
	if !strings.Contains(said.String(), "not an answer") {
		t.Errorf("not said:\n%s", said.String())
	}
}
