package integration

// The audit log under faults (issue 13, "Hold under load", item 7): a disk
// that fills up while the sandbox keeps connecting, and tunwall killed with
// SIGKILL. The disk is a real 64 KiB tmpfs the test mounts (and unmounts);
// the sandbox is a real python3 making connection after connection.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exitAuditLost is the documented exit status (README, "Exit status") of a
// run that lost audit records.
const exitAuditLost = 122

// smallDisk mounts a tmpfs of size bytes on a new directory and unmounts it
// when the test ends.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tunwall-disk-")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tunwall-test", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size+",mode=0777"); err != nil {
		os.Remove(dir)
		t.Fatalf("mount a %s tmpfs: %v", size, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir
}

// connectScript makes n connections to allowed.test:80 one after another
// (each sends a request and reads the answer), counts those that worked and
// those that did not, prints both, and exits 7.
func connectScript(n int) string {
	return fmt.Sprintf(`python3 - <<'PY'
import socket, sys
ok = bad = 0
for i in range(%d):
    try:
        s = socket.create_connection(("allowed.test", 80), timeout=5)
        s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
        while s.recv(4096):
            pass
        s.close()
        ok += 1
    except OSError:
        bad += 1
print("ok", ok, "failed", bad)
sys.exit(7)
PY`, n)
}

func TestAFullDiskLeavesAVerifiableLogAndAnExitStatusThatSaysSo(t *testing.T) {
	requireTools(t, "python3")
	w := newWorld(t)
	disk := smallDisk(t, "64k")
	log := filepath.Join(disk, "audit.jsonl")
	r := w.run(runOpts{
		flags:   []string{"--allow", "allowed.test:80", "--audit", log},
		script:  connectScript(600),
		timeout: 3 * time.Minute,
	})
	t.Logf("%s", r)

	// The disk did fill up: the sandbox saw connections work, then fail.
	m := regexp.MustCompile(`ok (\d+) failed (\d+)`).FindStringSubmatch(r.stdout)
	if m == nil || m[1] == "0" || m[2] == "0" {
		t.Fatalf("want some connections to work and then some to be refused once the log is full, got %q", r.stdout)
	}
	st, err := os.Stat(log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("log: %d bytes on a 64 KiB disk", st.Size())

	// Only whole lines, and the chain verifies.
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		tail := b[max(0, len(b)-120):]
		t.Errorf("the log ends in a torn line: ...%q", tail)
	}
	for i, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		if !json.Valid(l) {
			t.Errorf("line %d is not a whole JSON record: %.120q", i+1, l)
		}
	}
	out, err := exec.Command(tunwallBin, "audit", "verify", log).CombinedOutput()
	if err != nil {
		t.Errorf("tunwall audit verify on the log of a full disk: %v\n%s", err, out)
	}

	// The loss is in the trailer, and said on stderr, with the command's
	// own status.
	ls := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	var tr struct {
		Kind string `json:"kind"`
		Lost int    `json:"lost"`
	}
	json.Unmarshal(ls[len(ls)-1], &tr)
	if tr.Kind != "trailer" || tr.Lost == 0 {
		t.Errorf("want a trailer counting the lost records last, got %.300q", ls[len(ls)-1])
	}
	if r.code != exitAuditLost {
		t.Errorf("tunwall exited %d after losing audit records; want %d (the command's own status was 7)", r.code, exitAuditLost)
	}
	if !strings.Contains(r.stderr, "the command exited 7") || !regexp.MustCompile(`\d+ audit records? (were|was) lost`).MatchString(r.stderr) {
		t.Errorf("stderr does not say how many records were lost and the command's status:\n%s", r.stderr)
	}
}

// tempLeftovers lists the entries of dir named tunwall-*.
func tempLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "tunwall-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// killTunwall starts tunwall with o, waits until the sandbox's command
// says ready (its resolv.conf names tunwall), SIGKILLs tunwall and waits,
// bounded, for the sandbox's processes to be gone.
func (w *world) killTunwall(t *testing.T, o runOpts, sub string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, _ := w.tunwallCmd(ctx, o, sub)
	out, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("want ready (the sandbox's resolv.conf names tunwall), got %q\n%s", line, stderr.String())
	}
	kids := descendants(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	for i := 0; i < 100 && anyAlive(kids); i++ {
		time.Sleep(50 * time.Millisecond)
	}
}

func anyAlive(pids []int) bool {
	for _, p := range pids {
		if syscall.Kill(p, 0) == nil {
			return true
		}
	}
	return false
}

func TestSIGKILLOfTunwallLeavesNoTemporaryFiles(t *testing.T) {
	requireTools(t, "bwrap")
	w := newWorld(t)
	ready := `grep -q 198.18.0.1 /etc/resolv.conf && echo ready; while :; do sleep 0.05; done`
	for _, sub := range []string{"run", "bwrap", "run with a secret"} {
		t.Run(sub, func(t *testing.T) {
			// A private TMPDIR the sandbox's user may enter.
			tmp := filepath.Join(w.dir, "tmp-"+strings.ReplaceAll(sub, " ", "-"))
			if err := os.Mkdir(tmp, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(tmp, 0o777)
			o := runOpts{
				flags:  []string{"--allow", "allowed.test:80", "--quiet"},
				script: ready,
				env:    []string{"TMPDIR=" + tmp, "TW_TEST_TOKEN=s3cret-value"},
			}
			if sub == "bwrap" {
				o.bwrap = []string{"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"}
				sub = "bwrap"
			}
			if sub == "run with a secret" {
				// Secrets need a directory for the run (the placeholders'
				// file, the empty file over secret files): it is left by a
				// SIGKILL, and removed by the next run that makes one,
				// once its lock shows its tunwall is gone.
				o.flags = append(o.flags, "--secret", "TW_TEST_TOKEN=env:TW_TEST_TOKEN")
				w.killTunwall(t, o, "run")
				left := tempLeftovers(t, tmp)
				if len(left) != 1 || !strings.Contains(left[0], "tunwall-creds-") {
					t.Fatalf("want the killed run's tunwall-creds-* directory, found %v", left)
				}
				// Make it look older than a directory being set up.
				old := time.Now().Add(-time.Minute)
				os.Chtimes(left[0], old, old)
				o.script = "true"
				w.mustRun(0, o)
				if left := tempLeftovers(t, tmp); len(left) > 0 {
					t.Errorf("the next run did not remove the killed run's directory: %v", left)
				}
				return
			}
			w.killTunwall(t, o, sub)
			if left := tempLeftovers(t, tmp); len(left) > 0 {
				t.Errorf("after SIGKILL of tunwall %s, left behind in TMPDIR: %v", sub, left)
			}
		})
	}
}
